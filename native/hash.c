/* hash.c -- XXH64 (Yann Collet's xxHash, 64-bit variant), written from the
 * algorithm's public specification (doc/xxhash_spec.md in Cyan4973/xxHash).
 *
 * Used for the per-module checksums: about 10 GB/s here, so verifying a
 * module's chunk at first import costs microseconds.  Reads are done with
 * memcpy, so any alignment is fine.
 */
#include "pycds_native.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t
rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t
read64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;   /* the archive format is little-endian; so is every target */
}

static inline uint32_t
read32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t
round1(uint64_t acc, uint64_t input)
{
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t
merge(uint64_t acc, uint64_t val)
{
    acc ^= round1(0, val);
    return acc * P1 + P4;
}

uint64_t
pycds_hash64(const void *data, size_t n, uint64_t seed)
{
    const uint8_t *p = (const uint8_t *)data;
    const uint8_t *end = p + n;
    uint64_t h;

    if (n >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        const uint8_t *limit = end - 32;
        do {
            v1 = round1(v1, read64(p));
            v2 = round1(v2, read64(p + 8));
            v3 = round1(v3, read64(p + 16));
            v4 = round1(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = merge(h, v1);
        h = merge(h, v2);
        h = merge(h, v3);
        h = merge(h, v4);
    }
    else {
        h = seed + P5;
    }
    h += (uint64_t)n;
    while (p + 8 <= end) {
        h ^= round1(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}
