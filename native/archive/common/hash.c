/* hash.c -- the archive's two hashes.
 *
 * XXH64 (Yann Collet's xxHash, 64-bit variant), written from the
 * algorithm's public specification (doc/xxhash_spec.md in Cyan4973/xxHash):
 * the per-module checksums, fast enough that verifying a module's chunk at
 * first import costs little next to reading it.  Reads are done with
 * memcpy, so any alignment is fine.
 *
 * The keyed SipHash of _imp.source_hash (Python/pyhash.c): the checksums
 * of the header, meta block, bucket table and index entries, and the
 * names' bucket hash (docs/archive-format.md).
 */
#include "pycds_internal.h"

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

/* The four lanes over whole 32-byte stripes of p[0, count * 32). */
static void
stripes(uint64_t v[4], const uint8_t *p, size_t count)
{
    for (size_t i = 0; i < count; i++, p += 32) {
        v[0] = round1(v[0], read64(p));
        v[1] = round1(v[1], read64(p + 8));
        v[2] = round1(v[2], read64(p + 16));
        v[3] = round1(v[3], read64(p + 24));
    }
}

/* The digest of n bytes whose stripes went into v (if n >= 32) and whose
 * last n % 32 bytes are rest. */
static uint64_t
finish(const uint64_t v[4], size_t n, const uint8_t *rest, uint64_t seed)
{
    uint64_t h;
    if (n >= 32) {
        h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
        h = merge(h, v[0]);
        h = merge(h, v[1]);
        h = merge(h, v[2]);
        h = merge(h, v[3]);
    }
    else {
        h = seed + P5;
    }
    h += (uint64_t)n;
    const uint8_t *p = rest, *end = rest + n % 32;
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

uint64_t
pycds_hash64(const void *data, size_t n, uint64_t seed)
{
    return pycds_hash64_2(data, n, NULL, 0, seed);
}

uint64_t
pycds_hash64_2(const void *a, size_t na, const void *b, size_t nb, uint64_t seed)
{
    const uint8_t *pa = (const uint8_t *)a, *pb = (const uint8_t *)b;
    uint64_t v[4] = {seed + P1 + P2, seed + P2, seed, seed - P1};
    uint8_t buf[32];
    size_t n = na + nb;
    /* Whole stripes of a, then the stripe that spans a and b (through buf),
     * then whole stripes of b; the last n % 32 bytes end up contiguous. */
    stripes(v, pa, na / 32);
    size_t ra = na % 32, rb = nb;
    if (ra) {
        memcpy(buf, pa + na - ra, ra);
    }
    if (ra + nb < 32) {
        if (nb) {
            memcpy(buf + ra, pb, nb);
        }
        return finish(v, n, buf, seed);
    }
    if (ra) {
        memcpy(buf + ra, pb, 32 - ra);
        stripes(v, buf, 1);
        pb += 32 - ra;
        rb -= 32 - ra;
    }
    stripes(v, pb, rb / 32);
    return finish(v, n, pb + rb - rb % 32, seed);
}

/* ---- the keyed hash of _imp.source_hash --------------------------------- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define HALF_ROUND(a, b, c, d, s, t) \
    do { a += b; c += d; b = ROTL(b, s) ^ a; d = ROTL(d, t) ^ c; \
         a = ROTL(a, 32); } while (0)
#define SIP_ROUND(v0, v1, v2, v3) \
    do { HALF_ROUND(v0, v1, v2, v3, 13, 16); \
         HALF_ROUND(v2, v1, v0, v3, 17, 21); } while (0)

/* _Py_KeyedHash (Python/pyhash.c): SipHash with k0 = key, k1 = 0; 2-4 on
 * 3.10, 1-3 from 3.11 on.  Input words are read little-endian. */
uint64_t
pycds_keyed_hash(uint64_t key, const void *src, size_t n)
{
#if PY_VERSION_HEX < 0x030B0000
    const int crounds = 2, drounds = 4;
#else
    const int crounds = 1, drounds = 3;
#endif
    const uint8_t *in = src;
    uint64_t b = (uint64_t)n << 56;
    uint64_t v0 = key ^ 0x736f6d6570736575ULL;
    uint64_t v1 = 0 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = key ^ 0x6c7967656e657261ULL;
    uint64_t v3 = 0 ^ 0x7465646279746573ULL;
    uint64_t m, t = 0;
    int r;

    for (; n >= 8; n -= 8, in += 8) {
        m = 0;
        for (int i = 7; i >= 0; i--) {
            m = m << 8 | in[i];
        }
        v3 ^= m;
        for (r = 0; r < crounds; r++) {
            SIP_ROUND(v0, v1, v2, v3);
        }
        v0 ^= m;
    }
    for (int i = (int)n - 1; i >= 0; i--) {
        t = t << 8 | in[i];
    }
    b |= t;
    v3 ^= b;
    for (r = 0; r < crounds; r++) {
        SIP_ROUND(v0, v1, v2, v3);
    }
    v0 ^= b;
    v2 ^= 0xff;
    for (r = 0; r < drounds; r++) {
        SIP_ROUND(v0, v1, v2, v3);
    }
    return (v0 ^ v1) ^ (v2 ^ v3);
}
