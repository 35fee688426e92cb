// Files that are either whole or absent: write to a temporary name in the
// same directory, fsync, rename over the target, fsync the directory.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace anvil {

// Replaces `path` atomically with `contents`. Throws SystemError naming the
// path on failure and leaves no temporary file behind.
void write_file_atomic(const std::string& path, std::string_view contents);
// The same, for contents given as pieces (written in order, never copied).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// Makes a rename or a new file in `dir` durable (best effort).
void fsync_directory(const std::string& dir);

// Reads a whole file. Throws InputError naming the path if it cannot be read.
std::string read_file(const std::string& path);

}  // namespace anvil
