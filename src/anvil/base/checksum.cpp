#include "anvil/base/checksum.hpp"

#include <isa-l/crc.h>

namespace anvil {

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
}

}  // namespace anvil
