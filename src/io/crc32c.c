/* crc32c.c: CRC-32C (Castagnoli), the checksum of checkpoint segments.
 * The SSE4.2 crc32 instruction where the CPU has it (several GB/s, so that
 * verifying a checkpoint costs less than reading it); elsewhere a portable
 * slicing-by-8 table. Both give the standard value: crc32c("123456789") =
 * 0xE3069283. */
#include <pthread.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_io.h"

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[0][i] = c;
  }
  for (int t = 1; t < 8; t++)
    for (int i = 0; i < 256; i++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_portable(uint32_t c, const unsigned char *p, size_t n) {
  pthread_once(&table_once, build_table);
  while (n >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= c; /* little-endian hosts (the only ones fsdp builds for) */
    c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
        table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
    p += 8;
    n -= 8;
  }
  c = (uint32_t)c64;
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
#endif

uint32_t fsdp_crc32c_portable(uint32_t crc, const void *data, size_t n) {
  return data && n ? ~crc_portable(~crc, data, n) : crc;
}

uint32_t fsdp_crc32c(uint32_t crc, const void *data, size_t n) {
  uint32_t c = ~crc;
  if (!data || !n) return crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc_sse42(c, data, n);
#endif
  return ~crc_portable(c, data, n);
}
