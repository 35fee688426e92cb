// The one vocabulary for number types across anvil's commands and files:
// fp32, bf16, fp8, fp64, int32, int64, fp16, and tf32 (fp32 storage, GEMMs
// multiplied on tensor cores at TensorFloat-32 precision). The spellings other tools use (f32,
// float32, bfloat16, ...) are accepted as aliases and mean the same type.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>

namespace anvil {

enum class Dtype { fp32, bf16, fp8, fp64, int32, int64, fp16, tf32 };

// Bytes per element: fp8 1, bf16/fp16 2, fp32/tf32/int32 4, fp64/int64 8.
size_t dtype_bytes(Dtype dtype);

// The canonical name ("fp32", "bf16", ...).
std::string to_string(Dtype dtype);

// `text` as a Dtype, by its name or an alias; InputError naming `key` when it
// is none of `allowed` (every type when empty).
Dtype parse_dtype(const std::string& text, const std::string& key,
                  std::initializer_list<Dtype> allowed = {});

// "fp32 (f32, float32), bf16 (bfloat16)": the names of `allowed` with their
// aliases, for help texts.
std::string dtype_names(std::initializer_list<Dtype> allowed);

}  // namespace anvil
