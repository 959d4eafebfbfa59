/* test_sha256.c: SHA-256 against the FIPS 180-2 examples (empty, "abc", the
 * 448- and 896-bit messages, a million 'a') and against Python's hashlib at
 * the padding boundaries (lengths 55, 56, 63, 64, 65, 119, 120, 128 of a
 * fixed byte pattern; digests computed once with hashlib and written here);
 * the file version equals the buffer version; a missing file is an error
 * naming it. Exact equality of the hex digests. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static int digest_is(const void *p, size_t n, const char *want) {
  char hex[65];
  if (fsdp_sha256(p, n, hex) != FSDP_OK) return 0;
  if (strcmp(hex, want)) fprintf(stderr, "sha256 of %zu bytes: %s, expected %s\n", n, hex, want);
  return !strcmp(hex, want);
}

int main(void) {
  static const struct {
    const char *msg, *hex;
  } fips[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  for (size_t i = 0; i < sizeof fips / sizeof fips[0]; i++) CHECK(digest_is(fips[i].msg, strlen(fips[i].msg), fips[i].hex));

  static const struct {
    size_t n;
    const char *hex;
  } edges[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
  };
  unsigned char pattern[128];
  for (int i = 0; i < 128; i++) pattern[i] = (unsigned char)((i * 7 + 3) & 255);
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) CHECK(digest_is(pattern, edges[i].n, edges[i].hex));

  /* a million 'a': in memory, and as a file read in 64 KiB pieces */
  const char *million = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  size_t n = 1000000;
  char *a = malloc(n);
  CHECK(a != NULL);
  if (!a) return fsdp_test_summary("test_sha256");
  memset(a, 'a', n);
  CHECK(digest_is(a, n, million));
  char path[] = "/tmp/fsdp_sha256_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) {
    CHECK(write(fd, a, n) == (ssize_t)n);
    close(fd);
    char hex[65];
    CHECK_OK(fsdp_sha256_file(path, hex));
    CHECK(!strcmp(hex, million));
    unlink(path);
    CHECK_FAILS(fsdp_sha256_file(path, hex), FSDP_EIO, path);
  }
  free(a);
  char hex[65];
  CHECK_FAILS(fsdp_sha256(NULL, 3, hex), FSDP_EINVAL, "NULL");
  return fsdp_test_summary("test_sha256");
}
