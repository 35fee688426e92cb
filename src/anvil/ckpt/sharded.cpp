#include "anvil/ckpt/sharded.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <thread>

#include "anvil/base/checksum.hpp"
#include "anvil/base/clock.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/progress.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/tensor/tensor.hpp"

namespace anvil::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kIndexVersion = 2;
constexpr size_t kChunkBytes = size_t{8} << 20;  // bounded reads while loading and verifying

std::string rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d", rank);
  return buf;
}

uint32_t crc_of(const void* data, size_t bytes, uint32_t crc = 0) {
  return anvil::crc32(data, bytes, crc);
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  return tensor::numel(shape);
}

// A file opened for positioned reads, closed on scope exit.
class ReadFile {
 public:
  explicit ReadFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
    if (fd_ < 0) throw CorruptCheckpoint(path + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    size_ = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  ~ReadFile() { ::close(fd_); }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  uint64_t size() const { return size_; }
  void read(void* out, size_t bytes, uint64_t at) const {
    auto* p = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_, p, bytes, static_cast<off_t>(at));
      if (got <= 0) throw CorruptCheckpoint(path_ + ": short read at byte " + std::to_string(at));
      p += got;
      at += static_cast<uint64_t>(got);
      bytes -= static_cast<size_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_ = 0;
};

json parse_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / "index.json").string();
  json index;
  try {
    index = parse_json_unique(read_file(path), path);
  } catch (const InputError& e) {
    throw CorruptCheckpoint(e.what());
  }
  if (!index.is_object() || !index.contains("format") || index["format"] != "anvil-checkpoint" ||
      !index.contains("tensors") || !index["tensors"].is_object())
    throw CorruptCheckpoint(path + ": expected an anvil-checkpoint index with a tensors object");
  if (!index.contains("version") || !index["version"].is_number_integer() ||
      index["version"].get<int64_t>() != kIndexVersion)
    throw InputError(path + ": index version " + index.value("version", json()).dump() +
                     " (expected " + std::to_string(kIndexVersion) + ")");
  auto field = [&](const char* key, bool ok, const char* expected) {
    if (!ok) {
      std::string value = index.contains(key) ? index[key].dump() : "absent";
      if (value.size() > 60) value = value.substr(0, 57) + "...";
      throw CorruptCheckpoint(path + ": " + key + " is " + value + " (expected " + expected + ")");
    }
  };
  auto count_at = [&](const char* key, uint64_t least) {
    return index.contains(key) && index[key].is_number_unsigned() &&
           index[key].get<uint64_t>() >= least &&
           index[key].get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  };
  field("step", count_at("step", 0), "an integer >= 0");
  field("world", count_at("world", 1), "an integer >= 1");
  field("layout", !index.contains("layout") || index["layout"].is_object(), "an object");
  field("train_state", !index.contains("train_state") || index["train_state"].is_object(),
        "an object");
  for (const auto& [key, t] : index["tensors"].items()) {
    const std::string where = path + ": tensor " + key;
    if (!t.is_object()) throw CorruptCheckpoint(where + " is not an object");
    if (!t.contains("dtype") || t["dtype"] != "F32")
      throw CorruptCheckpoint(where + ": dtype " + (t.contains("dtype") ? t["dtype"].dump() : "absent") +
                              " (expected \"F32\")");
    if (!t.contains("kind") || (t["kind"] != "model" && t["kind"] != "optimizer"))
      throw CorruptCheckpoint(where + ": kind " + (t.contains("kind") ? t["kind"].dump() : "absent") +
                              " (expected \"model\" or \"optimizer\")");
  }
  return index;
}

// One shard of the index, checked for shape: its file, flat range in the
// tensor and byte range in the file.
struct Shard {
  std::string file;
  int64_t offset = 0, numel = 0;
  uint64_t begin = 0, end = 0;
  uint32_t crc = 0;
};

// An integer field, refused (not converted) when it is a float or a string.
int64_t integer_at(const json& j, const char* name) {
  const json& v = j.at(name);
  if (!v.is_number_integer()) throw CorruptCheckpoint(std::string(name) + " is not an integer");
  return v.get<int64_t>();
}

std::vector<Shard> shards_of(const std::string& dir, const std::string& key, const json& entry) {
  const std::string where = (fs::path(dir) / "index.json").string() + ": tensor " + key;
  std::vector<Shard> out;
  try {
    for (const auto& s : entry.at("shards")) {
      Shard sh;
      sh.file = s.at("file").get<std::string>();
      sh.offset = integer_at(s, "offset");
      sh.numel = integer_at(s, "numel");
      const json& bytes = s.at("bytes");
      if (!bytes.is_array() || bytes.size() != 2 || !bytes[0].is_number_unsigned() ||
          !bytes[1].is_number_unsigned() || !s.at("crc32").is_number_unsigned() ||
          s.at("crc32").get<uint64_t>() > 0xffffffffu)
        throw CorruptCheckpoint(where + ": a malformed shard " + s.dump());
      sh.begin = bytes[0].get<uint64_t>();
      sh.end = bytes[1].get<uint64_t>();
      sh.crc = static_cast<uint32_t>(s.at("crc32").get<uint64_t>());
      constexpr int64_t kMost = int64_t{1} << 44;
      if (sh.file.empty() || sh.file == "." || sh.file == ".." ||
          sh.file.find('/') != std::string::npos || sh.file.find('\0') != std::string::npos)
        throw CorruptCheckpoint(where + ": shard file " + json(sh.file).dump() +
                                (!sh.file.empty() && sh.file[0] == '/' ? " is an absolute path"
                                                                       : " is not a plain name") +
                                " (expected a file name inside the checkpoint folder)");
      if (sh.numel <= 0 || sh.offset < 0 ||
          sh.numel > kMost || sh.offset > kMost || sh.end < sh.begin ||
          sh.end - sh.begin != static_cast<uint64_t>(sh.numel) * sizeof(float))
        throw CorruptCheckpoint(where + ": a malformed shard " + s.dump());
      out.push_back(sh);
    }
  } catch (const json::exception& e) {
    throw CorruptCheckpoint(where + ": malformed shards (" + e.what() + ")");
  } catch (const CorruptCheckpoint& e) {
    if (std::string(e.what()).rfind(where, 0) == 0) throw;
    throw CorruptCheckpoint(where + ": " + e.what());
  }
  std::sort(out.begin(), out.end(),
            [](const Shard& a, const Shard& b) { return a.offset < b.offset; });
  return out;
}

std::vector<int64_t> shape_of(const json& entry) {
  std::vector<int64_t> shape;
  try {
    const json& j = entry.at("shape");
    if (!j.is_array()) throw CorruptCheckpoint("index.json: a shape that is not an array");
    for (const auto& d : j) {
      if (!d.is_number_integer()) throw CorruptCheckpoint("index.json: a non-integer dimension");
      shape.push_back(d.get<int64_t>());
    }
  } catch (const json::exception& e) {
    throw CorruptCheckpoint(std::string("index.json: a tensor without an integer shape (") +
                            e.what() + ")");
  }
  int64_t n = 1;
  for (const int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 44) / d))
      throw CorruptCheckpoint("index.json: shape " + json(shape).dump() +
                              " has a negative dimension or too many elements");
    n *= d;
  }
  return shape;
}

// The shards cover [0, numel) exactly once; "" when they do, else why not.
std::string coverage_problem(const std::vector<Shard>& shards, int64_t numel) {
  int64_t next = 0;
  for (const auto& s : shards) {
    if (s.offset != next)
      return "elements [" + std::to_string(std::min(next, s.offset)) + ", " +
             std::to_string(std::max(next, s.offset)) + ") " +
             (s.offset > next ? "missing" : "written twice");
    next = s.offset + s.numel;
  }
  if (next != numel)
    return "shards end at element " + std::to_string(next) + " of " + std::to_string(numel);
  return "";
}

// Every shard file the index names lies in the checkpoint folder (a symlink
// only to a file inside it), is a regular file, and holds the byte ranges
// of its shards, no two of them overlapping: so no read leaves the folder,
// nothing blocks on a FIFO or a device, and what loading allocates is
// bounded by the real file sizes.
void check_shard_files(const std::string& dir, const json& index) {
  const std::string index_path = (fs::path(dir) / "index.json").string();
  struct Range {
    uint64_t begin, end;
    std::string key;
  };
  std::map<std::string, std::vector<Range>> ranges;
  for (const auto& [key, t] : index["tensors"].items()) {
    const auto shards = shards_of(dir, key, t);
    if (const std::string why = coverage_problem(shards, numel_of(shape_of(t))); !why.empty())
      throw CorruptCheckpoint(index_path + ": tensor " + key + ": " + why);
    for (const auto& sh : shards) ranges[sh.file].push_back({sh.begin, sh.end, key});
  }
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  for (auto& [file, rs] : ranges) {
    const fs::path p = fs::path(dir) / file;
    const auto st = fs::symlink_status(p, ec);
    if (ec || !fs::exists(st))
      throw CorruptCheckpoint(p.string() + ": absent (" + index_path + " names it for tensor " +
                              rs.front().key + ")");
    if (fs::is_symlink(st)) {
      const fs::path target = fs::canonical(p, ec);
      const fs::path rel = ec ? fs::path() : target.lexically_relative(root);
      if (ec || rel.empty() || *rel.begin() == "..")
        throw CorruptCheckpoint(p.string() + ": a symlink to " +
                                (ec ? fs::read_symlink(p, ec).string() : target.string()) +
                                ", outside the checkpoint folder (expected the shard file itself)");
    }
    if (!fs::is_regular_file(p, ec))
      throw CorruptCheckpoint(p.string() + ": not a regular file (expected a safetensors shard)");
    const uint64_t size = fs::file_size(p, ec);
    std::sort(rs.begin(), rs.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    for (size_t i = 0; i < rs.size(); ++i) {
      const auto span = [&](const Range& r) {
        return "bytes [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") of tensor " +
               r.key;
      };
      if (rs[i].end > size)
        throw CorruptCheckpoint(p.string() + ": " + span(rs[i]) + " beyond the file's " +
                                std::to_string(size) + " (" + index_path + ")");
      if (i > 0 && rs[i].begin < rs[i - 1].end)
        throw CorruptCheckpoint(index_path + ": " + span(rs[i]) + " overlap " + span(rs[i - 1]) +
                                " in " + file + " (expected each byte in one shard)");
    }
  }
}

// Where a shard's bytes must go: elements [lo, hi) of the tensor into dst.
struct Target {
  int64_t lo, hi;
  float* dst;
};

// Reads a shard in chunks, checks its CRC, copies the targets' elements.
void read_shard(const ReadFile& file, const std::string& path, const std::string& key,
                const Shard& sh, const std::vector<Target>& targets, std::vector<char>& buffer) {
  if (sh.end > file.size())
    throw CorruptCheckpoint(path + ": tensor " + key + ": bytes [" + std::to_string(sh.begin) +
                            ", " + std::to_string(sh.end) + ") beyond the file's " +
                            std::to_string(file.size()));
  uint32_t crc = 0;
  for (uint64_t at = sh.begin; at < sh.end;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, sh.end - at));
    buffer.resize(std::max(buffer.size(), n));
    file.read(buffer.data(), n, at);
    crc = crc_of(buffer.data(), n, crc);
    // Elements of the tensor in this chunk: [c0, c1).
    const int64_t c0 = sh.offset + static_cast<int64_t>((at - sh.begin) / sizeof(float));
    const int64_t c1 = c0 + static_cast<int64_t>(n / sizeof(float));
    for (const auto& t : targets) {
      const int64_t lo = std::max(t.lo, c0), hi = std::min(t.hi, c1);
      if (lo >= hi) continue;
      std::memcpy(t.dst + (lo - t.lo), buffer.data() + (lo - c0) * sizeof(float),
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
    at += n;
  }
  if (crc != sh.crc)
    throw CorruptCheckpoint(path + ": tensor " + key + " (elements " + std::to_string(sh.offset) +
                            ".." + std::to_string(sh.offset + sh.numel) +
                            "): checksum mismatch (CRC-32 " + std::to_string(crc) + ", index says " +
                            std::to_string(sh.crc) + ")");
}

// A checkpoint's tensors read as a stream: each call asks for the next
// elements of a tensor, every shard's bytes are read once and in order, and
// a shard's CRC-32 is checked when its last byte has been read. A reshape
// passes the whole checkpoint through it (each output rank's elements in
// turn) without holding any of it.
class ShardStream {
 public:
  // A file is closed once all its shards are read (a checkpoint of
  // thousands of ranks never holds them all open).
  ShardStream(const std::string& dir, const json& index) : dir_(dir), index_(index) {
    for (const auto& [key, t] : index["tensors"].items())
      for (const Shard& sh : shards_of(dir, key, t)) unread_[sh.file] += sh.end - sh.begin;
  }

  // Copies elements [offset, offset + bytes / 4) of tensor `key` into dst.
  void read(const std::string& key, int64_t offset, char* dst, size_t bytes) {
    auto it = shards_.find(key);
    if (it == shards_.end())
      it = shards_.emplace(key, shards_of(dir_, key, index_["tensors"][key])).first;
    const int64_t lo = offset, hi = offset + static_cast<int64_t>(bytes / sizeof(float));
    for (const Shard& sh : it->second) {
      const int64_t b = std::max(lo, sh.offset), e = std::min(hi, sh.offset + sh.numel);
      if (b >= e) continue;
      const std::string path = (fs::path(dir_) / sh.file).string();
      Read& r = read_[{sh.file, sh.begin}];
      const uint64_t at = sh.begin + static_cast<uint64_t>(b - sh.offset) * sizeof(float);
      if (at != sh.begin + r.done)
        throw std::logic_error(path + ": shard of " + key + " read out of order");
      auto& f = files_[sh.file];
      if (!f) f = std::make_unique<ReadFile>(path);
      const auto n = static_cast<size_t>(e - b) * sizeof(float);
      char* out = dst + static_cast<size_t>(b - lo) * sizeof(float);
      f->read(out, n, at);
      r.crc = crc_of(out, n, r.crc);
      r.done += n;
      if (r.done == sh.end - sh.begin && r.crc != sh.crc)
        throw CorruptCheckpoint(
            path + ": tensor " + key + " (elements " + std::to_string(sh.offset) + ".." +
            std::to_string(sh.offset + sh.numel) + "): checksum mismatch (CRC-32 " +
            std::to_string(r.crc) + ", index says " + std::to_string(sh.crc) + ")");
      if ((unread_[sh.file] -= n) == 0) files_.erase(sh.file);
    }
  }

 private:
  struct Read {
    uint32_t crc = 0;
    uint64_t done = 0;  // bytes of the shard read so far
  };
  std::string dir_;
  const json& index_;
  std::map<std::string, std::vector<Shard>> shards_;
  std::map<std::pair<std::string, uint64_t>, Read> read_;
  std::map<std::string, std::unique_ptr<ReadFile>> files_;
  std::map<std::string, uint64_t> unread_;  // bytes of each file's shards not read yet
};

// A version-1 checkpoint (model.safetensors, optimizer.safetensors): the
// headers are read, then each wanted tensor (the last one read is kept for
// the next piece of it).
void load_version1(const std::string& dir, const std::vector<model::TensorShard>& want) {
  const fs::path d(dir);
  std::vector<SafetensorsReader> files;
  files.emplace_back((d / "model.safetensors").string());
  bool has_optimizer = false;
  for (const auto& w : want) has_optimizer |= files[0].shapes().count(w.key) == 0;
  if (has_optimizer && fs::exists(d / "optimizer.safetensors"))
    files.emplace_back((d / "optimizer.safetensors").string());
  std::string held;
  LoadedTensor t;
  for (const auto& w : want) {
    const SafetensorsReader* f = nullptr;
    for (const auto& r : files)
      if (r.shapes().count(w.key)) f = &r;
    if (f == nullptr) throw InputError(dir + ": no tensor " + w.key);
    if (f->shapes().at(w.key) != w.global_shape)
      throw InputError(f->path() + ": tensor " + w.key + ": shape " +
                       tensor::shape_string(f->shapes().at(w.key)) + " (expected " +
                       tensor::shape_string(w.global_shape) + ")");
    if (held != w.key) {
      held.clear();
      t = f->read(w.key);
      held = w.key;
    }
    std::memcpy(w.data, t.data.data() + w.offset, static_cast<size_t>(w.numel) * sizeof(float));
  }
}

}  // namespace

namespace {

// The temporary directory of one save: the step and the saving job's nonce
// (a job restarted after a crash never mixes its files with the dead one's).
fs::path tmp_dir_of(const std::string& run_dir, int64_t step, const std::string& nonce) {
  std::string tmp_name = ".";  // (append: GCC 12 warns falsely on "." + std::string)
  tmp_name.append(checkpoint_name(step)).append(".tmp-").append(nonce);
  return fs::path(run_dir) / tmp_name;
}

fs::path make_tmp_dir(const std::string& run_dir, int64_t step, const std::string& nonce) {
  const fs::path tmp_dir = tmp_dir_of(run_dir, step, nonce);
  std::error_code ec;
  fs::create_directories(tmp_dir, ec);
  if (ec)
    throw SystemError(tmp_dir.string() + ": cannot create directory: " + ec.message(), ec.value());
  return tmp_dir;
}

// Temporary directories no save will commit: other jobs' (crashed), and
// this job's of earlier steps.
void remove_stale(const std::string& run_dir, int64_t step, const std::string& nonce) {
  std::error_code ec;
  const std::string mine = "-" + nonce;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    const auto tmp = n.find(".tmp");
    if (n.rfind(".step-", 0) != 0 || tmp == std::string::npos) continue;
    const bool same_job = n.size() >= mine.size() && n.compare(n.size() - mine.size(), mine.size(), mine) == 0;
    int64_t s = -1;
    std::sscanf(n.c_str(), ".step-%ld", &s);
    if (!same_job || s < step) fs::remove_all(e.path(), ec);
  }
}

// Step 2 (every rank): its safetensors file and its part of the index.
// With `fill`, the pieces' bytes are made on the way (their `data` unused;
// fill's index counts the pieces given, model first).
void write_part(
    const fs::path& tmp_dir, int rank, int64_t step,
    const std::vector<model::TensorShard>& model_pieces,
    const std::vector<model::TensorShard>& optimizer_pieces,
    const std::function<void(size_t piece, uint64_t at, char* dst, size_t n)>& fill = {}) {
  std::vector<TensorRef> refs;
  json part = json::array();
  std::vector<std::string> names;
  for (const auto* list : {&model_pieces, &optimizer_pieces}) {
    const char* kind = list == &model_pieces ? "model" : "optimizer";
    for (const auto& s : *list) {
      if (s.replica != 0 || s.numel == 0) continue;
      names.push_back(s.key + "@" + std::to_string(s.offset));
      part.push_back({{"key", s.key},
                      {"kind", kind},
                      {"shape", s.global_shape},
                      {"sharding", model::to_string(s.sharding)},
                      {"offset", s.offset},
                      {"numel", s.numel}});
    }
  }
  size_t i = 0;
  std::vector<size_t> given;  // each written piece's index among those given
  for (const auto* list : {&model_pieces, &optimizer_pieces}) {
    for (const auto& s : *list) {
      const size_t at = (list == &model_pieces ? 0 : model_pieces.size()) +
                        static_cast<size_t>(&s - list->data());
      if (s.replica != 0 || s.numel == 0) continue;
      refs.push_back({names[i++], {s.numel}, s.data});
      given.push_back(at);
    }
  }
  const std::string file = rank_file(rank) + ".safetensors";
  const std::map<std::string, std::string> metadata = {{"format", "anvil-checkpoint-shard"},
                                                       {"rank", std::to_string(rank)},
                                                       {"step", std::to_string(step)}};
  const std::string path = (tmp_dir / file).string();
  const auto written =
      fill ? write_safetensors_filled(path, refs, metadata,
                                      [&](size_t piece, uint64_t at, char* dst, size_t n) {
                                        fill(given[piece], at, dst, n);
                                      })
           : write_safetensors_direct(path, refs, metadata);
  for (size_t k = 0; k < refs.size(); ++k) {
    part[k]["file"] = file;
    part[k]["rank"] = rank;
    part[k]["bytes"] = {written[k].begin, written[k].end};
    part[k]["crc32"] = written[k].crc32;
  }
  write_file_atomic((tmp_dir / (rank_file(rank) + ".json")).string(), part.dump());
}

// Step 3 (rank 0): the parts merged into index.json, written last; the
// directory renamed into place; older ones pruned.
std::string commit(const std::string& run_dir, int64_t step, const fs::path& tmp_dir, int world,
                   const std::string& state_json, const json& layout, int keep) {
  std::error_code ec;
  const fs::path final_dir = fs::path(run_dir) / checkpoint_name(step);
  json tensors = json::object();
  for (int r = 0; r < world; ++r) {
    const fs::path part_path = tmp_dir / (rank_file(r) + ".json");
    // Written by the ranks a moment ago: failing to read one back is the
    // system's fault (a full or failing disk), never bad input, and the save
    // error policy (--on-save-error) decides, not a usage error's exit 2.
    std::string part_text;
    try {
      part_text = read_file(part_path.string());
    } catch (const InputError& e) {
      throw SystemError("checkpoint step " + std::to_string(step) + ": rank " + std::to_string(r) +
                        "'s part: " + e.what());
    }
    for (const auto& p : json::parse(part_text)) {
      json& t = tensors[p.at("key").get<std::string>()];
      if (t.is_null())
        t = {{"dtype", "F32"},
             {"shape", p.at("shape")},
             {"kind", p.at("kind")},
             {"sharding", p.at("sharding")},
             {"shards", json::array()}};
      t["shards"].push_back({{"file", p.at("file")},
                             {"rank", p.at("rank")},
                             {"offset", p.at("offset")},
                             {"numel", p.at("numel")},
                             {"bytes", p.at("bytes")},
                             {"crc32", p.at("crc32")}});
    }
    fs::remove(part_path, ec);
  }
  for (auto& [key, t] : tensors.items()) {
    std::sort(t["shards"].begin(), t["shards"].end(), [](const json& a, const json& b) {
      return a["offset"].get<int64_t>() < b["offset"].get<int64_t>();
    });
    const std::string why =
        coverage_problem(shards_of(tmp_dir.string(), key, t), numel_of(shape_of(t)));
    if (!why.empty())
      throw SystemError("checkpoint step " + std::to_string(step) + ": tensor " + key + ": " +
                        why + " (the ranks' pieces do not tile it; a bug in the caller)");
  }
  json index = {{"format", "anvil-checkpoint"},
                {"version", kIndexVersion},
                {"step", step},
                {"world", world},
                {"layout", layout},
                {"checksum", "crc32 (zlib polynomial) of each shard's bytes"},
                {"train_state", json::parse(state_json)},
                {"tensors", tensors}};
  write_file_atomic((tmp_dir / "state.json").string(), state_json);
  write_file_atomic((tmp_dir / "index.json").string(), index.dump(1) + "\n");
  fsync_directory(tmp_dir.string());
  // A checkpoint of the same step from an earlier run is swapped with the
  // new one in one step (the old one then sits at the temporary name and is
  // deleted): a crash in between leaves one whole checkpoint of the step,
  // never none. Where the file system cannot swap, the old one goes first.
  if (fs::exists(final_dir) &&
      ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_directory(run_dir);
    remove_checkpoint(tmp_dir.string());
  } else {
    if (fs::exists(final_dir)) remove_checkpoint(final_dir.string());
    fs::rename(tmp_dir, final_dir, ec);
    if (ec)
      throw SystemError(final_dir.string() + ": cannot rename into place: " + ec.message(),
                        ec.value());
  }
  fsync_directory(run_dir);
  prune_checkpoints(run_dir, keep, final_dir.string());
  return final_dir.string();
}

}  // namespace

std::string shard_file(int rank) {
  return rank_file(rank) + ".safetensors";
}

void prune_to_newest_intact(const std::string& run_dir) {
  const auto dirs = checkpoint_dirs(run_dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (!verify_checkpoint(*it).problems.empty()) continue;
    // Everything else goes: older ones, and newer ones that are damaged.
    for (const auto& d : dirs)
      if (d != *it) remove_checkpoint(d);
    return;
  }
}

namespace {

// A rank that could not write its part says so (rank 0 stops waiting for it).
std::string failed_marker(int rank) {
  return rank_file(rank) + ".failed";
}

std::string marker_reason(const fs::path& marker) {
  std::string why;
  try {
    why = read_file(marker.string());
  } catch (const InputError&) {
  }
  return why.empty() ? "it had no room to say why" : why;
}

// This rank's part; on a full disk, the run directory pruned down to its
// newest intact checkpoint and one more try.
void write_part_or_make_room(const std::string& run_dir, const fs::path& tmp_dir,
                             const SaveGroup& group, int64_t step, const ShardedSave& save,
                             std::string* note) {
  const int rank = group.rank;
  try {
    write_part(tmp_dir, rank, step, save.model, save.optimizer, save.fill);
  } catch (const SystemError& e) {
    if (e.os_error() != ENOSPC) throw;
    std::error_code ec;
    fs::remove(tmp_dir / shard_file(rank), ec);
    prune_to_newest_intact(run_dir);
    if (note) *note = "disk full; pruned to the newest intact checkpoint and retried";
    if (group.before_retry) group.before_retry();
    write_part(tmp_dir, rank, step, save.model, save.optimizer, save.fill);
  }
}

}  // namespace

std::string save_sharded(const std::string& run_dir, int64_t step, const ShardedSave& save,
                         const SaveGroup& group, int keep, std::string* note) {
  const fs::path tmp_dir = make_tmp_dir(run_dir, step, group.nonce);
  const std::string final_dir = (fs::path(run_dir) / checkpoint_name(step)).string();
  std::error_code ec;
  if (group.rank != 0) {
    try {
      write_part_or_make_room(run_dir, tmp_dir, group, step, save, note);
    } catch (const std::exception& e) {
      // Nothing of this rank's stays behind; rank 0 sees the marker, gives
      // up the step and removes the folder.
      fs::remove(tmp_dir / shard_file(group.rank), ec);
      const std::string marker = (tmp_dir / failed_marker(group.rank)).string();
      try {
        write_file_atomic(marker, e.what());
      } catch (const SystemError&) {  // no room for the reason: an empty marker
        const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) ::close(fd);
      }
      throw;
    }
    return final_dir;
  }
  try {
    write_part_or_make_room(run_dir, tmp_dir, group, step, save, note);
    // Rank 0 commits once every part is there.
    const double start = now_seconds();
    for (int r = 1; r < group.world; ++r) {
      while (!fs::exists(tmp_dir / (rank_file(r) + ".json"))) {
        if (fs::exists(tmp_dir / failed_marker(r)))
          throw SystemError(tmp_dir.string() + ": rank " + std::to_string(r) +
                            " could not write its part (" + marker_reason(tmp_dir / failed_marker(r)) +
                            "); the checkpoint of step " + std::to_string(step) +
                            " is not committed");
        if (now_seconds() - start > group.timeout_s)
          throw SystemError(tmp_dir.string() + ": rank " + std::to_string(r) +
                            " wrote no part within " +
                            std::to_string(static_cast<int>(group.timeout_s)) +
                            " s; the checkpoint of step " + std::to_string(step) +
                            " is not committed");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    commit(run_dir, step, tmp_dir, group.world, save.state_json, save.layout, keep);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);  // never a half-written folder left behind
    throw;
  }
  remove_stale(run_dir, step, group.nonce);
  return final_dir;
}

std::string reshape_checkpoint(const std::string& from, const std::string& run_dir, int world) {
  if (world < 1) throw InputError("--to: expected a rank count >= 1");
  const std::string src = resolve_checkpoint(from);
  const json state = read_state(src);
  const int64_t step = state.at("step").get<int64_t>();
  if (fs::exists(fs::path(run_dir) / checkpoint_name(step)))
    throw InputError("--out: " + (fs::path(run_dir) / checkpoint_name(step)).string() +
                     " exists; expected a run directory without that step");
  // The shard files are checked before anything is written. Each output
  // rank's file is then written as its elements are read (ShardStream):
  // memory holds a write buffer, not the checkpoint. A version-1 checkpoint
  // (two whole files) is read an output rank at a time.
  const bool indexed = fs::exists(fs::path(src) / "index.json");
  json index;
  if (indexed) {
    index = parse_index(src);
    check_shard_files(src, index);
  }
  const auto model_shapes = tensor_shapes(src, "model");
  const auto optimizer_shapes = tensor_shapes(src, "optimizer");
  // Every tensor, model first, in key order, cut into `world` runs of
  // (nearly) equal length: rank r writes elements [r T / W, (r + 1) T / W).
  struct Whole {
    const std::string* key;
    const std::vector<int64_t>* shape;
    int64_t numel;
    bool model;
  };
  std::vector<Whole> all;
  int64_t total = 0;
  for (const auto& [k, s] : model_shapes) all.push_back({&k, &s, numel_of(s), true});
  for (const auto& [k, s] : optimizer_shapes) all.push_back({&k, &s, numel_of(s), false});
  for (const auto& w : all) total += w.numel;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const std::string nonce = "reshape-" + std::to_string(::getpid());
  const fs::path tmp_dir = make_tmp_dir(run_dir, step, nonce);
  // A failure on the way (a full disk, a damaged shard) leaves no shards behind.
  struct RemoveUnlessCommitted {
    fs::path dir;
    bool committed = false;
    ~RemoveUnlessCommitted() {
      std::error_code ec;
      if (!committed) fs::remove_all(dir, ec);
    }
  } cleanup{tmp_dir};
  std::unique_ptr<ShardStream> stream;
  if (indexed) stream = std::make_unique<ShardStream>(src, index);
  // Progress by MiB written (a checkpoint of billions of parameters takes minutes).
  const auto total_mib = static_cast<size_t>((static_cast<uint64_t>(total) * sizeof(float)) >> 20);
  const bool show = total_mib >= 256;
  uint64_t written = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t lo = total * r / world, hi = total * (r + 1) / world;
    std::vector<model::TensorShard> m, o;
    std::deque<std::vector<float>> buffers;  // a version-1 source: this rank's elements
    int64_t at = 0;
    for (const auto& w : all) {
      const int64_t b = std::max(lo, at), e = std::min(hi, at + w.numel);
      if (b < e) {
        float* data = nullptr;
        if (!indexed) data = buffers.emplace_back(static_cast<size_t>(e - b)).data();
        (w.model ? m : o)
            .push_back({*w.key, *w.shape, b - at, e - b, 0, model::Sharding::replicated, data});
      }
      at += w.numel;
    }
    if (!indexed) {
      std::vector<model::TensorShard> want = m;
      want.insert(want.end(), o.begin(), o.end());
      load_pieces(src, want);
      write_part(tmp_dir, r, step, m, o);
      continue;
    }
    write_part(tmp_dir, r, step, m, o, [&](size_t piece, uint64_t at, char* dst, size_t n) {
      const model::TensorShard& p = piece < m.size() ? m[piece] : o[piece - m.size()];
      stream->read(p.key, p.offset + static_cast<int64_t>(at / sizeof(float)), dst, n);
      if (((written + n) >> 20) != (written >> 20))  // a line per MiB at most
        progress_line(show, std::min(static_cast<size_t>((written + n) >> 20), total_mib - 1),
                      total_mib, "MiB written to " + rank_file(r) + ".safetensors");
      written += n;
    });
  }
  progress_line(show, total_mib, total_mib, "");
  json layout = {{"world", world}, {"reshaped_from", fs::absolute(src).string()}};
  const std::string out = commit(run_dir, step, tmp_dir, world, read_state_json(src), layout, 0);
  cleanup.committed = true;
  remove_stale(run_dir, step, nonce);
  return out;
}

PieceReader::PieceReader(const std::string& dir) : dir_(dir) {
  if (!fs::exists(fs::path(dir) / "index.json")) return;  // version 1
  index_ = parse_index(dir);
  check_shard_files(dir, index_);
}

void load_pieces(const std::string& dir, const std::vector<model::TensorShard>& want) {
  PieceReader(dir).load(want);
}

void PieceReader::load(const std::vector<model::TensorShard>& want) const {
  const std::string& dir = dir_;
  if (index_.is_null()) {
    load_version1(dir, want);
    return;
  }
  const json& index = index_;
  const json& tensors = index["tensors"];
  // Per (file, shard): the wanted element ranges it serves.
  struct Job {
    std::string key;
    Shard shard;
    std::vector<Target> targets;
  };
  std::map<std::pair<std::string, uint64_t>, Job> jobs;  // ordered by file, then byte
  for (const auto& w : want) {
    const auto it = tensors.find(w.key);
    if (it == tensors.end())
      throw InputError((fs::path(dir) / "index.json").string() + ": no tensor " + w.key);
    const auto shape = shape_of(*it);
    if (shape != w.global_shape) {
      json a = shape, b = w.global_shape;
      throw InputError(dir + ": tensor " + w.key + " has shape " + a.dump() + " (expected " +
                       b.dump() + ")");
    }
    const auto shards = shards_of(dir, w.key, *it);
    if (const std::string why = coverage_problem(shards, numel_of(shape)); !why.empty())
      throw CorruptCheckpoint(dir + "/index.json: tensor " + w.key + ": " + why);
    for (const auto& sh : shards) {
      const int64_t lo = std::max(w.offset, sh.offset);
      const int64_t hi = std::min(w.offset + w.numel, sh.offset + sh.numel);
      if (lo >= hi) continue;
      Job& job = jobs[{sh.file, sh.begin}];
      job.key = w.key;
      job.shard = sh;
      job.targets.push_back({lo, hi, w.data + (lo - w.offset)});
    }
  }
  std::vector<char> buffer;
  std::unique_ptr<ReadFile> file;
  std::string open_name;
  for (const auto& [where, job] : jobs) {
    const std::string path = (fs::path(dir) / where.first).string();
    if (open_name != where.first) {
      file = std::make_unique<ReadFile>(path);
      open_name = where.first;
    }
    read_shard(*file, path, job.key, job.shard, job.targets, buffer);
  }
}

void load_weights(const std::string& dir, const model::ParamRegistry& registry, float* params,
                  const std::vector<model::ExtraTensor>& extra) {
  std::vector<model::TensorShard> want = registry.shards(params, {{0, registry.total()}});
  for (const auto& e : extra) {
    if (e.optimizer_state) continue;
    want.push_back({e.name, e.shape, 0, numel_of(e.shape), 0, model::Sharding::replicated, e.data});
  }
  load_pieces(dir, want);
}

std::map<std::string, LoadedTensor> read_tensors(const std::string& dir, const std::string& kind,
                                                 const std::set<std::string>* only) {
  std::map<std::string, LoadedTensor> out;
  if (!fs::exists(fs::path(dir) / "index.json")) {
    const std::string name = kind == "model" ? "model.safetensors" : "optimizer.safetensors";
    const SafetensorsReader reader((fs::path(dir) / name).string());
    for (const auto& [key, shape] : reader.shapes())
      if (only == nullptr || only->count(key) > 0) out[key] = reader.read(key);
    return out;
  }
  const json index = parse_index(dir);
  check_shard_files(dir, index);
  std::vector<model::TensorShard> want;
  for (const auto& [key, t] : index["tensors"].items()) {
    if (!t.is_object() || !t.contains("kind") || t["kind"] != kind) continue;
    if (only != nullptr && only->count(key) == 0) continue;
    // Nothing is allocated for a tensor whose shards the files cannot hold.
    const auto shape = shape_of(t);
    const auto shards = shards_of(dir, key, t);
    if (const std::string why = coverage_problem(shards, numel_of(shape)); !why.empty())
      throw CorruptCheckpoint(dir + "/index.json: tensor " + key + ": " + why);
    for (const auto& sh : shards) {
      std::error_code ec;
      const auto size = fs::file_size(fs::path(dir) / sh.file, ec);
      if (ec || sh.end > size)
        throw CorruptCheckpoint((fs::path(dir) / sh.file).string() + ": tensor " + key +
                                ": bytes [" + std::to_string(sh.begin) + ", " +
                                std::to_string(sh.end) + ") beyond the file" +
                                (ec ? " (absent)" : "'s " + std::to_string(size)));
    }
    LoadedTensor& lt = out[key];
    lt.shape = shape;
    lt.data.assign(static_cast<size_t>(numel_of(lt.shape)), 0.0f);
  }
  for (auto& [key, lt] : out)
    want.push_back({key, lt.shape, 0, static_cast<int64_t>(lt.data.size()), 0,
                    model::Sharding::replicated, lt.data.data()});
  load_pieces(dir, want);
  return out;
}

std::map<std::string, std::vector<int64_t>> tensor_shapes(const std::string& dir,
                                                          const std::string& kind) {
  std::map<std::string, std::vector<int64_t>> out;
  if (!fs::exists(fs::path(dir) / "index.json")) {
    const std::string name = kind == "model" ? "model.safetensors" : "optimizer.safetensors";
    return SafetensorsReader((fs::path(dir) / name).string()).shapes();
  }
  const json index = parse_index(dir);
  for (const auto& [key, t] : index["tensors"].items())
    if (t.is_object() && t.contains("kind") && t["kind"] == kind) out[key] = shape_of(t);
  return out;
}

VerifyReport verify_checkpoint(const std::string& dir, const TensorCheck& tensors) {
  VerifyReport r;
  r.dir = dir;
  if (!fs::exists(fs::path(dir) / "index.json")) {
    if (!fs::exists(fs::path(dir) / "model.safetensors")) {  // neither layout's files
      r.problems.push_back(dir + ": no index.json (and no version-1 model.safetensors)");
      return r;
    }
    r.version = 1;
    try {
      for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
        const fs::path p = fs::path(dir) / name;
        if (!fs::exists(p) && std::string(name) == "optimizer.safetensors") continue;
        const auto f = read_safetensors(p.string());
        r.tensors += static_cast<int64_t>(f.tensors.size());
        r.shards += static_cast<int64_t>(f.tensors.size());
        r.bytes += static_cast<int64_t>(fs::file_size(p));
      }
      read_state(dir);
    } catch (const std::exception& e) {
      r.problems.push_back(e.what());
    }
    return r;
  }
  json index, state;
  try {
    index = parse_index(dir);
    check_shard_files(dir, index);
    // The trainer resumes from state.json; the index keeps a copy of it.
    state = read_state(dir);
    if (index.contains("train_state") && state != index["train_state"])
      throw InputError(dir + "/state.json: differs from index.json's train_state");
    // The step the directory is named for, the index's and the state's agree.
    const std::string name = fs::path(dir).filename().string();
    if (state.contains("step") && index.contains("step") && state["step"] != index["step"])
      throw InputError(dir + "/index.json: step " + index["step"].dump() + ", state.json's " +
                       state["step"].dump());
    if (index.contains("step") && index["step"].is_number_integer() &&
        name.rfind("step-", 0) == 0 && name != checkpoint_name(index["step"].get<int64_t>()))
      throw InputError(dir + "/index.json: step " + index["step"].dump() +
                       ", not the step its directory is named for");
  } catch (const std::exception& e) {
    r.problems.push_back(e.what());
    return r;
  }
  r.version = kIndexVersion;
  r.layout = index.contains("layout") ? index["layout"] : json::object();
  if (tensors) r.problems = tensors(dir, state, index);
  std::map<std::string, std::unique_ptr<ReadFile>> files;
  std::vector<char> buffer;
  // Progress by MiB read (a checkpoint of billions of parameters takes
  // minutes; check_shard_files above read the same index whole).
  uint64_t total = 0;
  for (const auto& [key, t] : index["tensors"].items())
    for (const auto& sh : shards_of(dir, key, t)) total += sh.end - sh.begin;
  const size_t total_mib = static_cast<size_t>(total >> 20);
  const bool show = total_mib >= 256;
  for (const auto& [key, t] : index["tensors"].items()) {
    ++r.tensors;
    try {
      const auto shards = shards_of(dir, key, t);
      if (const std::string why = coverage_problem(shards, numel_of(shape_of(t))); !why.empty())
        throw CorruptCheckpoint(dir + "/index.json: tensor " + key + ": " + why);
      for (const auto& sh : shards) {
        ++r.shards;
        progress_line(show, std::min(static_cast<size_t>(r.bytes >> 20), total_mib - 1), total_mib,
                      "MiB of " + dir + " verified");
        r.bytes += static_cast<int64_t>(sh.end - sh.begin);
        const std::string path = (fs::path(dir) / sh.file).string();
        auto& f = files[sh.file];
        if (!f) f = std::make_unique<ReadFile>(path);
        read_shard(*f, path, key, sh, {}, buffer);
      }
    } catch (const std::exception& e) {
      r.problems.push_back(e.what());
    }
  }
  progress_line(show, total_mib, total_mib, "");
  return r;
}

std::string checkpoint_to_read(const std::string& path,
                               const std::function<void(const std::string&)>& warn,
                               const TensorCheck& tensors) {
  const fs::path p(path);
  if (fs::exists(p / "state.json") || fs::exists(p / "index.json")) return resolve_checkpoint(path);
  const auto to_stderr = [](const std::string& why) {
    std::fprintf(stderr, "anvil: warning: %s\n", why.c_str());
  };
  return newest_intact_checkpoint(path, warn ? warn : to_stderr, tensors);
}

std::string newest_intact_checkpoint(const std::string& path,
                                     const std::function<void(const std::string&)>& warn,
                                     const TensorCheck& tensors) {
  const fs::path p(path);
  if (fs::exists(p / "state.json") || fs::exists(p / "index.json")) {
    const VerifyReport r = verify_checkpoint(path, tensors);
    if (!r.problems.empty()) throw CorruptCheckpoint(r.problems.front());
    return path;
  }
  resolve_checkpoint(path);  // throws, naming the path, when it holds none
  const auto dirs = checkpoint_dirs(path);
  std::vector<std::string> skipped;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const VerifyReport r = verify_checkpoint(*it, tensors);
    if (r.problems.empty()) {
      if (warn)
        for (const auto& why : skipped) warn(why + "; using " + *it);
      return *it;
    }
    skipped.push_back(*it + " is damaged: " + r.problems.front() +
                      (r.problems.size() > 1
                           ? " (and " + std::to_string(r.problems.size() - 1) + " more)"
                           : ""));
  }
  throw CorruptCheckpoint(path + ": no intact checkpoint; the newest, " + skipped.front());
}

}  // namespace anvil::ckpt
