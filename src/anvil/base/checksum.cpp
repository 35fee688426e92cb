#include "anvil/base/checksum.hpp"

#include <isa-l/crc.h>

namespace anvil {

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
}

uint32_t crc32c(const void* data, size_t n) {
  // ISA-L's iSCSI CRC takes the register's initial value and returns it
  // unfinished: the standard CRC-32C starts from and ends with all ones.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // ISA-L does not write it
  uint32_t crc = 0xFFFFFFFFu;
  while (n > 0) {  // its length is an int
    const int chunk = static_cast<int>(n > (1u << 30) ? (1u << 30) : n);
    crc = crc32_iscsi(p, chunk, crc);
    p += chunk;
    n -= static_cast<size_t>(chunk);
  }
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace anvil
