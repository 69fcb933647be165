/* prefetchd.kernel._http: the native GET client (download.client: native).
 *
 * One Engine is one C thread (pthread) running epoll over up to `connections` non-blocking
 * HTTP/1.1 keep-alive TCP connections to one address (resolved in Python). Python submits GETs
 * (SigV4-signed here, on the engine thread); each 2xx body is written with pwrite() into the
 * file descriptor Python gave, at the offset it gave, and its CRC32 or CRC32C (whichever
 * x-amz-checksum header the response names) is taken while it arrives, so Python need not read
 * the file back. Finished requests are queued as completions and wait() hands Python every one
 * that is ready at once: one wake, one GIL hand-over for many objects. A caller that can wait
 * a little asks wait() to gather (`least` completions, or the oldest `hold` seconds old): behind
 * a real network objects finish spread out in time, and a wake per object costs the caller a
 * futex, a context switch and its cold caches per object (issue 28's paced figures).
 * set_limit() caps the requests on the wire below `connections` (the adaptive limit), so the
 * caller may queue more requests than it lets go out: a connection that frees takes the next
 * at once, while its completion waits to be gathered.
 *
 * Why C at all: awscrt cost Python ~0.25 ms per small object (request setup, a Future, an
 * Event, a GIL hand-over per callback); this costs Python one submit() and a share of one
 * wait() per object.
 *
 * Threads: the engine thread never touches a Python object. A request's tag is a Python
 * reference taken in submit() and handed back in wait(), both under the GIL; everything the
 * engine thread reads or writes is plain C memory guarded by the engine's mutex where Python
 * threads share it (the submit queue, the completions, the credentials).
 *
 * Faults complete a request with an errno and what arrived, never hang it: a connect that
 * takes longer than connect_timeout or a response silent for idle_timeout (ETIMEDOUT), a reset
 * or EOF mid-response (ECONNRESET / ECONNABORTED), a malformed response (EPROTO), headers
 * larger than MAX_HEAD (E2BIG), a 2xx whose size differs from what was asked (EMSGSIZE, before
 * a byte is written), a failed pwrite (its errno: ENOSPC...), cancel_all() (ECANCELED). A kept-
 * alive connection the server closed before answering is not a fault: the request is sent once
 * more at once on a fresh connection. Memory is bounded: headers by MAX_HEAD, an error body by
 * MAX_ERROR_BODY, chunk-size lines and trailers by small constants.
 *
 * SHA-256 and HMAC-SHA256 are written here from FIPS 180-4 / RFC 2104 (no new library); CRC32
 * is folded with carry-less multiply where the CPU has it, else zlib's (the library Python's
 * zlib module uses); CRC32C is Google's libcrc32c, whose address set_crc32c() is given, as for
 * _native.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define MAX_HEAD (64 * 1024)        /* status line and headers */
#define MAX_ERROR_BODY (64 * 1024)  /* what is kept of a non-2xx body */
#define MAX_LINE 256                /* a chunk-size line */
#define MAX_TRAILERS (8 * 1024)
#define RECV_BUFFER (256 * 1024)
#define MAX_CONNECTIONS 1024

typedef uint32_t (*crc_extend_fn)(uint32_t, const uint8_t *, size_t);
static crc_extend_fn crc32c_extend = NULL;

/* ---- CRC32 (zlib's polynomial) -------------------------------------------------------------- */

/* zlib's crc32 here (1.2.13) does ~1.3 GB/s: 0.1 ms of the engine thread per 128 KiB object,
 * more than ISA-L's read-back it replaces. With carry-less multiply (every x86-64 since 2010)
 * the body is folded 64 bytes at a time instead ("Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ", Intel 2009; the constants are the Linux kernel's crc32-pclmul ones for the
 * reflected polynomial 0xEDB88320), ~10x faster; the unaligned tail goes to zlib. Tested
 * against zlib on random lengths and splits (test_http_engine.py). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL 1

/* The CRC state (not inverted: zlib's value ^ 0xffffffff) over `len` bytes, len >= 64 and a
 * multiple of 16. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_fold(const uint8_t *buf,
                                                                    size_t len, uint32_t crc) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64, len -= 64;
    while (len >= 64) { /* four 128-bit lanes folded forward 512 bits at a time */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64, len -= 64;
    }
    x0 = k3k4; /* the four lanes folded into one */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) { /* the 16-byte blocks left */
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16, len -= 16;
    }
    /* 128 bits to 64, then Barrett-reduced to 32 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = poly;
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static int clmul = -1; /* whether this CPU has it: asked once, at import */

/* zlib's crc32(crc, data, n): the same value, folded with carry-less multiply where it can. */
static uint32_t crc32_update(uint32_t crc, const uint8_t *data, size_t n) {
#ifdef HAVE_CLMUL
    if (clmul && n >= 64) {
        size_t folded = n & ~(size_t)15;
        crc = ~crc32_fold(data, folded, ~crc);
        data += folded, n -= folded;
    }
#endif
    return (uint32_t)crc32(crc, data, (uInt)n);
}

/* ---- SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) --------------------------------------- */

typedef struct {
    uint32_t h[8];
    uint64_t length;
    uint8_t block[64];
    size_t used;
} sha256;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_init(sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->length = 0;
    s->used = 0;
}

static void sha256_block(sha256 *s, const uint8_t *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) +
                      K256[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d;
    s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha256_update(sha256 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->length += n;
    while (n > 0) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->block + s->used, p, take);
        s->used += take, p += take, n -= take;
        if (s->used == 64) {
            sha256_block(s, s->block);
            s->used = 0;
        }
    }
}

static void sha256_final(sha256 *s, uint8_t out[32]) {
    uint64_t bits = s->length * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    sha256_update(s, &pad, 1);
    while (s->used != 56) sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24), out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8), out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

static void hmac_sha256(const uint8_t *key, size_t key_len, const void *msg, size_t n,
                        uint8_t out[32]) {
    uint8_t k[64] = {0}, pad[64], inner[32];
    sha256 s;
    if (key_len > 64) {
        sha256_init(&s);
        sha256_update(&s, key, key_len);
        sha256_final(&s, k);
    } else {
        memcpy(k, key, key_len);
    }
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    sha256_update(&s, msg, n);
    sha256_final(&s, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    sha256_update(&s, inner, 32);
    sha256_final(&s, out);
}

static void hex(const uint8_t *p, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = digits[p[i] >> 4], out[2 * i + 1] = digits[p[i] & 15];
    out[2 * n] = 0;
}

/* ---- growable strings ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
    int failed; /* an allocation failed: the string is unusable */
} str;

static void str_add(str *s, const char *data, size_t n) {
    if (s->failed) return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *p = realloc(s->p, cap);
        if (p == NULL) {
            s->failed = 1;
            return;
        }
        s->p = p, s->cap = cap;
    }
    memcpy(s->p + s->len, data, n);
    s->len += n;
    s->p[s->len] = 0;
}

static void str_cat(str *s, const char *text) { str_add(s, text, strlen(text)); }

/* ---- SigV4 ------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;  /* lower case */
    const char *value; /* trimmed */
} header;

static int header_order(const void *a, const void *b) {
    return strcmp(((const header *)a)->name, ((const header *)b)->name);
}

/* The signing key of AWS4 for (secret, date, region, "s3"). */
static void signing_key(const char *secret, const char *date, const char *region, uint8_t out[32]) {
    str k = {0};
    str_cat(&k, "AWS4");
    str_cat(&k, secret);
    uint8_t a[32], b[32];
    hmac_sha256((const uint8_t *)(k.p ? k.p : ""), k.len, date, strlen(date), a);
    hmac_sha256(a, 32, region, strlen(region), b);
    hmac_sha256(b, 32, "s3", 2, a);
    hmac_sha256(a, 32, "aws4_request", 12, out);
    if (k.p) memset(k.p, 0, k.cap);
    free(k.p);
}

/* The Authorization value of a GET of `path` (already URI-encoded, no query) with `headers`
 * (sorted in place; they must include host, x-amz-date and x-amz-content-sha256), signed with
 * `key` (signing_key of the date in amz_date). Returns 0, or -1 when out of memory. */
static int authorization(str *out, const char *path, header *headers, size_t count,
                         const char *amz_date, const char *region, const char *access,
                         const uint8_t key[32]) {
    qsort(headers, count, sizeof *headers, header_order);
    str canonical = {0}, signed_names = {0}, to_sign = {0};
    str_cat(&canonical, "GET\n");
    str_cat(&canonical, path);
    str_cat(&canonical, "\n\n");
    for (size_t i = 0; i < count; i++) {
        str_cat(&canonical, headers[i].name);
        str_cat(&canonical, ":");
        str_cat(&canonical, headers[i].value);
        str_cat(&canonical, "\n");
        if (i) str_cat(&signed_names, ";");
        str_cat(&signed_names, headers[i].name);
    }
    str_cat(&canonical, "\n");
    str_cat(&canonical, signed_names.p ? signed_names.p : "");
    str_cat(&canonical, "\nUNSIGNED-PAYLOAD");
    char scope[128], digest_hex[65], signature[65];
    snprintf(scope, sizeof scope, "%.8s/%s/s3/aws4_request", amz_date, region);
    uint8_t digest[32];
    sha256 s;
    sha256_init(&s);
    sha256_update(&s, canonical.p ? canonical.p : "", canonical.len);
    sha256_final(&s, digest);
    hex(digest, 32, digest_hex);
    str_cat(&to_sign, "AWS4-HMAC-SHA256\n");
    str_cat(&to_sign, amz_date);
    str_cat(&to_sign, "\n");
    str_cat(&to_sign, scope);
    str_cat(&to_sign, "\n");
    str_cat(&to_sign, digest_hex);
    int failed = canonical.failed || signed_names.failed || to_sign.failed;
    if (!failed) {
        hmac_sha256(key, 32, to_sign.p, to_sign.len, digest);
        hex(digest, 32, signature);
        str_cat(out, "AWS4-HMAC-SHA256 Credential=");
        str_cat(out, access);
        str_cat(out, "/");
        str_cat(out, scope);
        str_cat(out, ", SignedHeaders=");
        str_cat(out, signed_names.p);
        str_cat(out, ", Signature=");
        str_cat(out, signature);
        failed = out->failed;
    }
    free(canonical.p), free(signed_names.p), free(to_sign.p);
    return failed ? -1 : 0;
}

/* ---- the response parser (pure: bytes in, callbacks out; fuzzed under ASan) ----------------- */

enum { P_HEAD, P_BODY, P_BODY_EOF, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_END, P_TRAILER, P_DONE };

/* The response headers Python is told (lower case); the rest are skipped. */
static const char *const KEPT[] = {
    "content-length", "content-range", "etag", "connection", "transfer-encoding",
    "x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-crc64nvme",
    "x-amz-checksum-sha1", "x-amz-checksum-sha256", "x-amz-checksum-type", "retry-after",
};
#define N_KEPT (sizeof KEPT / sizeof KEPT[0])
enum { H_LENGTH, H_RANGE, H_ETAG, H_CONNECTION, H_ENCODING, H_CRC32, H_CRC32C };

typedef struct parser parser;
typedef struct {
    /* After the headers: 0 to go on, else an errno that ends the response (refused). */
    int (*on_head)(void *ctx, parser *p);
    /* A piece of the body: 0, or an errno (a failed write) that ends the response. */
    int (*on_body)(void *ctx, const char *data, size_t n);
} parser_calls;

struct parser {
    int phase;
    int status;
    int64_t content_length; /* -1: not given */
    int chunked;
    int close;                /* Connection: close, or HTTP/1.0 */
    int64_t left;             /* body or chunk bytes still to come */
    char head[MAX_HEAD];
    size_t head_len;
    char *kept[N_KEPT]; /* pointers into head, NUL-terminated once parsed */
    char line[MAX_LINE];
    size_t line_len;
    size_t trailers;
    int64_t body_seen; /* bytes of body delivered to on_body */
};

static void parser_reset(parser *p) {
    p->phase = P_HEAD;
    p->status = 0;
    p->content_length = -1;
    p->chunked = 0;
    p->close = 0;
    p->left = 0;
    p->head_len = 0;
    memset(p->kept, 0, sizeof p->kept);
    p->line_len = 0;
    p->trailers = 0;
    p->body_seen = 0;
}

static int ci_equal(const char *a, size_t n, const char *lower) {
    size_t m = strlen(lower);
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != lower[i]) return 0;
    }
    return 1;
}

static int ci_contains(const char *value, const char *lower) {
    size_t m = strlen(lower);
    for (const char *v = value; *v; v++)
        if (ci_equal(v, strnlen(v, m), lower)) return 1;
    return 0;
}

/* A decimal of at most 18 digits (no sign), or -1. */
static int64_t decimal(const char *s) {
    int64_t v = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (++digits > 18) return -1;
        v = v * 10 + (*s - '0');
    }
    return digits && *s == 0 ? v : -1;
}

/* Parse the head (status line and headers, head[0:head_len], ending in an empty line) in
 * place: lines are NUL-terminated, kept values pointed at. Returns 0 or EPROTO. */
static int parse_head(parser *p) {
    char *s = p->head, *end = p->head + p->head_len;
    char *eol = memchr(s, '\n', (size_t)(end - s));
    if (eol == NULL) return EPROTO;
    *eol = 0;
    if (eol > s && eol[-1] == '\r') eol[-1] = 0;
    /* HTTP/1.x SSS reason */
    if (strncmp(s, "HTTP/1.", 7) != 0 || (s[7] != '0' && s[7] != '1') || s[8] != ' ') return EPROTO;
    if (s[9] < '1' || s[9] > '5' || s[10] < '0' || s[10] > '9' || s[11] < '0' || s[11] > '9')
        return EPROTO;
    if (s[12] != ' ' && s[12] != 0) return EPROTO;
    p->status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    p->close = s[7] == '0';
    s = eol + 1;
    while (s < end) {
        eol = memchr(s, '\n', (size_t)(end - s));
        if (eol == NULL) return EPROTO;
        *eol = 0;
        if (eol > s && eol[-1] == '\r') eol[-1] = 0;
        if (*s == 0) break; /* the empty line */
        char *colon = strchr(s, ':');
        if (colon == NULL || colon == s) return EPROTO;
        char *value = colon + 1;
        while (*value == ' ' || *value == '\t') value++;
        char *tail = value + strlen(value);
        while (tail > value && (tail[-1] == ' ' || tail[-1] == '\t')) *--tail = 0;
        for (size_t i = 0; i < N_KEPT; i++)
            if (ci_equal(s, (size_t)(colon - s), KEPT[i])) p->kept[i] = value;
        s = eol + 1;
    }
    if (p->kept[H_ENCODING] != NULL) {
        if (!ci_contains(p->kept[H_ENCODING], "chunked")) return EPROTO;
        p->chunked = 1;
    } else if (p->kept[H_LENGTH] != NULL) {
        p->content_length = decimal(p->kept[H_LENGTH]);
        if (p->content_length < 0) return EPROTO;
    }
    if (p->kept[H_CONNECTION] != NULL) {
        if (ci_contains(p->kept[H_CONNECTION], "close")) p->close = 1;
        else if (ci_contains(p->kept[H_CONNECTION], "keep-alive")) p->close = 0;
    }
    return 0;
}

static int deliver(parser *p, const parser_calls *calls, void *ctx, const char *data, size_t n) {
    if (n == 0) return 0;
    p->body_seen += (int64_t)n;
    return calls->on_body(ctx, data, n);
}

/* Take the bytes of a chunk-size line or a trailer line into p->line; 1 once a whole line is
 * there, 0 if more is needed, -1 if it is too long. */
static int take_line(parser *p, const char **data, size_t *n) {
    while (*n > 0) {
        char c = **data;
        (*data)++, (*n)--;
        if (c == '\n') {
            if (p->line_len && p->line[p->line_len - 1] == '\r') p->line_len--;
            p->line[p->line_len] = 0;
            return 1;
        }
        if (p->line_len + 1 >= MAX_LINE) return -1;
        p->line[p->line_len++] = c;
    }
    return 0;
}

static int chunk_size(const char *line, int64_t *size) {
    int64_t v = 0;
    int digits = 0;
    for (; *line; line++) {
        int d;
        if (*line >= '0' && *line <= '9') d = *line - '0';
        else if (*line >= 'a' && *line <= 'f') d = *line - 'a' + 10;
        else if (*line >= 'A' && *line <= 'F') d = *line - 'A' + 10;
        else break;
        if (++digits > 15) return EPROTO;
        v = v * 16 + d;
    }
    if (!digits || (*line && *line != ';' && *line != ' ' && *line != '\t')) return EPROTO;
    *size = v;
    return 0;
}

/* After the head: where the body starts. */
static int begin_body(parser *p, int head_only) {
    if (head_only || p->status == 204 || p->status == 304 || p->status < 200) {
        p->phase = P_DONE;
    } else if (p->chunked) {
        p->phase = P_CHUNK_SIZE;
        p->line_len = 0;
    } else if (p->content_length >= 0) {
        p->left = p->content_length;
        p->phase = p->left ? P_BODY : P_DONE;
    } else {
        p->phase = P_BODY_EOF; /* the body ends when the server closes */
        p->close = 1;
    }
    return 0;
}

/* Feed `n` bytes. Returns 0 (more wanted, or p->phase == P_DONE), or an errno: EPROTO,
 * E2BIG, or what a callback returned. Bytes after the end of the response are EPROTO (no
 * pipelining: the server may not send them). */
static int parser_feed(parser *p, const parser_calls *calls, void *ctx, const char *data,
                       size_t n) {
    while (n > 0) {
        switch (p->phase) {
        case P_HEAD: {
            size_t room = MAX_HEAD - 1 - p->head_len;
            size_t take = n < room ? n : room;
            size_t from = p->head_len > 3 ? p->head_len - 3 : 0;
            memcpy(p->head + p->head_len, data, take);
            p->head_len += take;
            p->head[p->head_len] = 0;
            char *found = NULL;
            for (size_t i = from; i + 1 < p->head_len; i++) {
                if (p->head[i] == '\n' && p->head[i + 1] == '\n') {
                    found = p->head + i + 2;
                    break;
                }
                if (i + 3 < p->head_len && memcmp(p->head + i, "\r\n\r\n", 4) == 0) {
                    found = p->head + i + 4;
                    break;
                }
            }
            if (found == NULL) {
                if (p->head_len >= MAX_HEAD - 1) return E2BIG;
                data += take, n -= take;
                break;
            }
            size_t head_used = (size_t)(found - p->head);
            size_t from_data = head_used - (p->head_len - take); /* bytes of `data` in the head */
            p->head_len = head_used;
            data += from_data, n -= from_data;
            int err = parse_head(p);
            if (!err) err = begin_body(p, 0);
            if (!err && calls->on_head) err = calls->on_head(ctx, p);
            if (err) return err;
            break;
        }
        case P_BODY: {
            size_t take = (int64_t)n < p->left ? n : (size_t)p->left;
            int err = deliver(p, calls, ctx, data, take);
            if (err) return err;
            data += take, n -= take, p->left -= (int64_t)take;
            if (p->left == 0) p->phase = P_DONE;
            break;
        }
        case P_BODY_EOF: {
            int err = deliver(p, calls, ctx, data, n);
            if (err) return err;
            n = 0;
            break;
        }
        case P_CHUNK_SIZE: {
            int got = take_line(p, &data, &n);
            if (got < 0) return EPROTO;
            if (got == 0) break;
            p->line_len = 0;
            int err = chunk_size(p->line, &p->left);
            if (err) return err;
            p->phase = p->left ? P_CHUNK_DATA : P_TRAILER;
            break;
        }
        case P_CHUNK_DATA: {
            size_t take = (int64_t)n < p->left ? n : (size_t)p->left;
            int err = deliver(p, calls, ctx, data, take);
            if (err) return err;
            data += take, n -= take, p->left -= (int64_t)take;
            if (p->left == 0) p->phase = P_CHUNK_END;
            break;
        }
        case P_CHUNK_END: {
            int got = take_line(p, &data, &n);
            if (got < 0) return EPROTO;
            if (got == 0) break;
            if (p->line_len != 0) return EPROTO; /* the CRLF after a chunk's data */
            p->phase = P_CHUNK_SIZE;
            break;
        }
        case P_TRAILER: {
            size_t before = n;
            int got = take_line(p, &data, &n);
            p->trailers += before - n;
            if (got < 0 || p->trailers > MAX_TRAILERS) return EPROTO;
            if (got == 0) break;
            int empty = p->line[0] == 0;
            p->line_len = 0;
            if (empty) p->phase = P_DONE;
            break;
        }
        case P_DONE:
            return EPROTO;
        }
    }
    return 0;
}

/* ---- the engine's requests and connections ---------------------------------------------------- */

enum { ALG_NONE, ALG_CRC32, ALG_CRC32C };

typedef struct request {
    struct request *next;
    PyObject *tag; /* owned; touched only with the GIL (submit, wait, dealloc) */
    char *host, *path, *range, *if_match;
    int checksum_mode;
    int fd;
    int64_t offset, length, total;
    int resent;    /* sent again after a kept-alive connection closed unanswered */
    /* the outcome */
    int status, err;
    int64_t written;
    char *kept[N_KEPT]; /* copies of the response's kept headers */
    int crc_alg;
    uint32_t crc;
    char *error_body;
    size_t error_len;
} request;

enum { C_FREE, C_CONNECTING, C_SENDING, C_RECEIVING, C_IDLE };

typedef struct {
    int fd;
    int state;
    int served;      /* responses completed on this connection */
    int got_bytes;   /* any byte of the current response arrived */
    request *req;
    double deadline; /* CLOCK_MONOTONIC seconds; 0: none */
    str out;         /* the request being sent */
    size_t sent;
    parser *p;
    int to_file;     /* the body goes to req->fd (a 2xx), else to req->error_body */
    uint32_t events; /* what epoll watches on fd for it now (without EPOLLRDHUP) */
} conn;

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    int started, closed;
    int epoll, wake;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int max_conns;
    double connect_timeout, idle_timeout;
    char *region;
    conn *conns;
    char *buffer; /* RECV_BUFFER bytes, the engine thread's */
    int unannounced; /* completions queued and wait() not woken for them (engine thread's) */
    int limit;       /* requests on the wire at most (set_limit; <= max_conns) */
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t ready;
    request *queue_head, *queue_tail;
    request *done_head, *done_tail;
    int done_count;       /* completions queued */
    double done_first_at; /* when the oldest of them was queued (CLOCK_MONOTONIC seconds) */
    int want;             /* the waiting wait()'s `least` (1 when none waits) */
    double hold;          /* the waiting wait()'s `hold` seconds (0 when none waits) */
    int stopping, cancelling;
    int interrupted; /* interrupt(): the next (or current) wait() returns at once */
    char *access, *secret, *token;
    char key_date[9];
    uint8_t key[32];
    int key_valid;
    /* counters (under lock): for tests and stats() */
    long long connects, requests, resends;
    long long wakes; /* eventfd writes by submit() */
    long long epoll_calls; /* epoll_ctl calls (engine thread; read atomically by stats()) */
} Engine;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void request_free(request *r) {
    free(r->host), free(r->path), free(r->range), free(r->if_match);
    for (size_t i = 0; i < N_KEPT; i++) free(r->kept[i]);
    free(r->error_body);
    free(r);
}

static void wake_engine(Engine *e) {
    uint64_t one = 1;
    ssize_t done = write(e->wake, &one, sizeof one);
    (void)done; /* a full eventfd counter still wakes the loop */
}

/* Queue `r` as done (engine thread, or close() after the thread ended); announce() wakes
 * wait() for it. */
static void complete(Engine *e, request *r, int err) {
    if (err && !r->err) r->err = err;
    r->next = NULL;
    double t = now();
    pthread_mutex_lock(&e->lock);
    if (e->done_tail) e->done_tail->next = r;
    else e->done_head = r, e->done_first_at = t;
    e->done_tail = r;
    e->done_count++;
    pthread_mutex_unlock(&e->lock);
    e->unannounced = 1;
}

/* Whether wait(least, hold) may return the completions queued now (under the lock). */
static int gathered(Engine *e, int least, double hold, double t) {
    return e->done_count >= least || (e->done_head && t >= e->done_first_at + hold);
}

/* Wake wait() for what complete() queued: once per round of the engine's loop, not once per
 * request (a wake is a futex call on each side when Python waits), and only once the waiter's
 * `least` are queued or the oldest has waited its `hold`. Returns when to look again (the
 * oldest's hold ending), or 0. */
static double announce(Engine *e) {
    if (!e->unannounced) return 0;
    double t = now(), again = 0;
    pthread_mutex_lock(&e->lock);
    if (e->done_head == NULL) {
        e->unannounced = 0; /* taken by a wait(0) meanwhile */
    } else if (gathered(e, e->want, e->hold, t)) {
        e->unannounced = 0;
        pthread_cond_broadcast(&e->ready);
    } else {
        again = e->done_first_at + e->hold;
    }
    pthread_mutex_unlock(&e->lock);
    return again;
}

static void conn_close(Engine *e, conn *c) {
    if (c->fd >= 0) {
        epoll_ctl(e->epoll, EPOLL_CTL_DEL, c->fd, NULL);
        __atomic_fetch_add(&e->epoll_calls, 1, __ATOMIC_RELAXED);
        close(c->fd);
    }
    c->fd = -1;
    c->events = 0;
    c->state = C_FREE;
    c->req = NULL;
    c->served = 0;
    free(c->out.p);
    memset(&c->out, 0, sizeof c->out);
}

/* Watch `events` on c's socket. Only a change is a syscall: a kept-alive connection watches
 * EPOLLIN from one response to the next request's answer (the request is sent at once, with no
 * EPOLLOUT, unless the socket is full), which were two epoll_ctl per object. */
static void conn_watch(Engine *e, conn *c, uint32_t events) {
    if (c->events == events) return;
    c->events = events;
    struct epoll_event ev = {.events = events | EPOLLRDHUP, .data.ptr = c};
    epoll_ctl(e->epoll, EPOLL_CTL_MOD, c->fd, &ev);
    __atomic_fetch_add(&e->epoll_calls, 1, __ATOMIC_RELAXED);
}

/* The x-amz-date of now ("20260101T000000Z"). */
static void amz_date_now(char out[17]) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* The request text of `r` into c->out, signed with the engine's credentials. 0 or an errno. */
static int build_request(Engine *e, conn *c, request *r) {
    char amz_date[17];
    amz_date_now(amz_date);
    header h[8];
    size_t n = 0;
    h[n++] = (header){"host", r->host};
    if (r->if_match) h[n++] = (header){"if-match", r->if_match};
    if (r->range) h[n++] = (header){"range", r->range};
    if (r->checksum_mode) h[n++] = (header){"x-amz-checksum-mode", "ENABLED"};
    h[n++] = (header){"x-amz-content-sha256", "UNSIGNED-PAYLOAD"};
    h[n++] = (header){"x-amz-date", amz_date};
    str auth = {0};
    pthread_mutex_lock(&e->lock);
    if (e->access == NULL) {
        pthread_mutex_unlock(&e->lock);
        return EACCES; /* no credentials: Python says so before submitting */
    }
    if (e->token) h[n++] = (header){"x-amz-security-token", e->token};
    if (!e->key_valid || strncmp(e->key_date, amz_date, 8) != 0) {
        memcpy(e->key_date, amz_date, 8);
        e->key_date[8] = 0;
        signing_key(e->secret, e->key_date, e->region, e->key);
        e->key_valid = 1;
    }
    int failed = authorization(&auth, r->path, h, n, amz_date, e->region, e->access, e->key);
    str *o = &c->out;
    o->len = 0;
    str_cat(o, "GET ");
    str_cat(o, r->path);
    str_cat(o, " HTTP/1.1\r\n");
    for (size_t i = 0; i < n; i++) {
        str_cat(o, h[i].name);
        str_cat(o, ": ");
        str_cat(o, h[i].value);
        str_cat(o, "\r\n");
    }
    pthread_mutex_unlock(&e->lock); /* the token is copied into the request text now */
    str_cat(o, "authorization: ");
    str_cat(o, auth.p ? auth.p : "");
    str_cat(o, "\r\n\r\n");
    free(auth.p);
    if (failed || o->failed) return ENOMEM;
    c->sent = 0;
    return 0;
}

/* ---- receiving ------------------------------------------------------------------------------- */

static int crc_algorithm(parser *p) {
    if (p->kept[H_CRC32]) return ALG_CRC32;
    if (p->kept[H_CRC32C] && crc32c_extend) return ALG_CRC32C;
    return ALG_NONE;
}

/* The object's whole size a 2xx tells: Content-Range's total, else Content-Length; -1. */
static int64_t stored_total(parser *p) {
    if (p->kept[H_RANGE]) {
        const char *slash = strrchr(p->kept[H_RANGE], '/');
        return slash ? decimal(slash + 1) : -1;
    }
    return p->content_length;
}

static int on_head(void *ctx, parser *p) {
    conn *c = ctx;
    request *r = c->req;
    r->status = p->status;
    for (size_t i = 0; i < N_KEPT; i++) {
        free(r->kept[i]);
        r->kept[i] = dup_or_null(p->kept[i]);
    }
    c->to_file = p->status >= 200 && p->status < 300;
    if (!c->to_file) return 0;
    /* Refused before a byte is written: what arrives would not be what was asked. */
    int64_t total = stored_total(p);
    if ((p->content_length >= 0 && p->content_length != r->length) ||
        (total >= 0 && total != r->total))
        return EMSGSIZE;
    r->crc_alg = crc_algorithm(p);
    r->crc = 0;
    return 0;
}

static int on_body(void *ctx, const char *data, size_t n) {
    conn *c = ctx;
    request *r = c->req;
    if (!c->to_file) {
        size_t room = MAX_ERROR_BODY - r->error_len;
        size_t take = n < room ? n : room;
        if (take == 0) return 0; /* bounded: the rest is read and dropped */
        if (r->error_body == NULL && (r->error_body = malloc(MAX_ERROR_BODY)) == NULL)
            return ENOMEM;
        memcpy(r->error_body + r->error_len, data, take);
        r->error_len += take;
        return 0;
    }
    if (r->written + (int64_t)n > r->length) return EMSGSIZE; /* a chunked 2xx, too long */
    if (r->crc_alg == ALG_CRC32) r->crc = crc32_update(r->crc, (const uint8_t *)data, n);
    else if (r->crc_alg == ALG_CRC32C) r->crc = crc32c_extend(r->crc, (const uint8_t *)data, n);
    while (n > 0) {
        ssize_t w = pwrite(r->fd, data, n, r->offset + r->written);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        r->written += w, data += w, n -= (size_t)w;
    }
    return 0;
}

static const parser_calls FILE_CALLS = {on_head, on_body};

static void finish_request(Engine *e, conn *c, int err) {
    request *r = c->req;
    c->req = NULL;
    if (!err && c->to_file && r->written != r->length) err = ECONNABORTED;
    complete(e, r, err);
}

/* The response on `c` ended: complete its request, keep the connection or close it. */
static void response_done(Engine *e, conn *c) {
    /* An answer before the whole request was sent leaves the connection out of step. */
    int keep = !c->p->close && c->sent == c->out.len;
    finish_request(e, c, 0);
    c->served++;
    if (!keep) {
        conn_close(e, c);
        return;
    }
    c->state = C_IDLE;
    c->deadline = 0;
    conn_watch(e, c, EPOLLIN);
}

/* The connection failed with `err` while serving its request. A kept-alive connection closed
 * before a byte of the answer came is the server dropping an idle connection: the request goes
 * back to the front of the queue once, not a fault. */
static void conn_failed(Engine *e, conn *c, int err) {
    request *r = c->req;
    int stale = r && c->served > 0 && !c->got_bytes && !r->resent &&
                (err == ECONNRESET || err == ECONNABORTED || err == EPIPE);
    c->req = NULL;
    conn_close(e, c);
    if (r == NULL) return;
    if (stale) {
        r->resent = 1;
        pthread_mutex_lock(&e->lock);
        e->resends++;
        r->next = e->queue_head;
        e->queue_head = r;
        if (!e->queue_tail) e->queue_tail = r;
        pthread_mutex_unlock(&e->lock);
        return;
    }
    complete(e, r, err);
}

static void on_readable(Engine *e, conn *c) {
    for (;;) {
        ssize_t got = recv(c->fd, e->buffer, RECV_BUFFER, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_failed(e, c, errno);
            return;
        }
        if (got == 0) { /* EOF */
            if (c->state == C_RECEIVING && c->p->phase == P_BODY_EOF) {
                response_done(e, c);
                conn_close(e, c);
            } else {
                conn_failed(e, c, ECONNABORTED);
            }
            return;
        }
        if (c->state != C_RECEIVING && c->state != C_SENDING) {
            conn_close(e, c); /* bytes on an idle connection: nothing asked for them */
            return;
        }
        c->got_bytes = 1;
        c->deadline = now() + e->idle_timeout;
        int err = parser_feed(c->p, &FILE_CALLS, c, e->buffer, (size_t)got);
        if (err) {
            request *r = c->req;
            c->req = NULL;
            conn_close(e, c); /* what is left of the response is unread */
            complete(e, r, err);
            return;
        }
        if (c->p->phase == P_DONE) {
            response_done(e, c);
            return;
        }
        if (got < RECV_BUFFER) return; /* level-triggered: epoll says when there is more */
    }
}

static void on_writable(Engine *e, conn *c) {
    if (c->state == C_CONNECTING) {
        int soerr = 0;
        socklen_t len = sizeof soerr;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr) {
            conn_failed(e, c, soerr);
            return;
        }
        c->state = C_SENDING;
        c->deadline = now() + e->idle_timeout;
    }
    while (c->sent < c->out.len) {
        ssize_t w = send(c->fd, c->out.p + c->sent, c->out.len - c->sent, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return;
            conn_failed(e, c, errno);
            return;
        }
        c->sent += (size_t)w;
    }
    c->state = C_RECEIVING;
    c->deadline = now() + e->idle_timeout;
    conn_watch(e, c, EPOLLIN);
}

/* ---- the loop ------------------------------------------------------------------------------- */

static request *pop_queued(Engine *e) {
    pthread_mutex_lock(&e->lock);
    request *r = e->queue_head;
    if (r) {
        e->queue_head = r->next;
        if (!e->queue_head) e->queue_tail = NULL;
        r->next = NULL;
        e->requests++;
    }
    pthread_mutex_unlock(&e->lock);
    return r;
}

static int open_connection(Engine *e, conn *c) {
    int fd = socket(e->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&e->addr, e->addr_len) < 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return err;
    }
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLRDHUP, .data.ptr = c};
    __atomic_fetch_add(&e->epoll_calls, 1, __ATOMIC_RELAXED);
    if (epoll_ctl(e->epoll, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int err = errno;
        close(fd);
        return err;
    }
    c->fd = fd;
    c->events = EPOLLOUT;
    c->state = C_CONNECTING;
    c->served = 0;
    c->deadline = now() + e->connect_timeout;
    pthread_mutex_lock(&e->lock);
    e->connects++;
    pthread_mutex_unlock(&e->lock);
    return 0;
}

/* Give `r` to `c` (idle, or free: a new connection is opened). */
static void start_on(Engine *e, conn *c, request *r) {
    c->req = r;
    c->got_bytes = 0;
    c->to_file = 0;
    parser_reset(c->p);
    r->status = 0, r->written = 0, r->crc_alg = ALG_NONE, r->error_len = 0;
    int err = build_request(e, c, r);
    if (!err && c->state == C_FREE) err = open_connection(e, c);
    if (err) {
        c->req = NULL;
        if (c->state == C_FREE) free(c->out.p), memset(&c->out, 0, sizeof c->out);
        complete(e, r, err);
        return;
    }
    if (c->state == C_IDLE) {
        c->state = C_SENDING;
        c->deadline = now() + e->idle_timeout;
        on_writable(e, c);
        if (c->state == C_SENDING) conn_watch(e, c, EPOLLOUT);
    }
}

/* Hand queued requests to idle connections first (keep-alive), then to new ones. */
static void dispatch(Engine *e) {
    pthread_mutex_lock(&e->lock);
    int limit = e->limit;
    pthread_mutex_unlock(&e->lock);
    for (;;) {
        conn *idle = NULL, *spare = NULL;
        int busy = 0;
        for (int i = 0; i < e->max_conns; i++) {
            if (e->conns[i].req) busy++;
            else if (e->conns[i].state == C_IDLE && idle == NULL) idle = &e->conns[i];
            else if (e->conns[i].state == C_FREE && spare == NULL) spare = &e->conns[i];
        }
        if (busy >= limit || (idle == NULL && spare == NULL)) return;
        request *r = pop_queued(e);
        if (r == NULL) return;
        /* A request a kept-alive connection dropped unanswered goes out on a new connection
         * where there is room for one: the next idle connection may have been dropped by the
         * server just the same, and a second drop is a fault. */
        start_on(e, (r->resent && spare) ? spare : (idle ? idle : spare), r);
    }
}

static void expire(Engine *e, double t) {
    for (int i = 0; i < e->max_conns; i++) {
        conn *c = &e->conns[i];
        if (c->req && c->deadline > 0 && t >= c->deadline) conn_failed(e, c, ETIMEDOUT);
    }
}

/* Complete every queued and in-flight request with ECANCELED (engine thread, or close()). */
static void cancel_everything(Engine *e) {
    pthread_mutex_lock(&e->lock);
    request *r = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    e->cancelling = 0;
    pthread_mutex_unlock(&e->lock);
    while (r) {
        request *next = r->next;
        complete(e, r, ECANCELED);
        r = next;
    }
    for (int i = 0; i < e->max_conns; i++) {
        conn *c = &e->conns[i];
        if (c->req) {
            request *q = c->req;
            c->req = NULL;
            conn_close(e, c);
            complete(e, q, ECANCELED);
        }
    }
}

/* How long epoll may sleep: until the soonest connection's deadline, or `soonest` (a batch's
 * hold ending) if that is sooner and not 0. */
static int wait_ms(Engine *e, double t, double soonest) {
    for (int i = 0; i < e->max_conns; i++) {
        double d = e->conns[i].deadline;
        if (e->conns[i].req && d > 0 && (soonest == 0 || d < soonest)) soonest = d;
    }
    if (soonest == 0) return 1000;
    double ms = (soonest - t) * 1000 + 1;
    return ms < 0 ? 0 : ms > 1000 ? 1000 : (int)ms;
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    struct epoll_event events[64];
    for (;;) {
        pthread_mutex_lock(&e->lock);
        int stopping = e->stopping, cancelling = e->cancelling;
        pthread_mutex_unlock(&e->lock);
        if (stopping) break;
        if (cancelling) cancel_everything(e);
        dispatch(e);
        /* the last round's completions (and dispatch's), before sleeping; a batch not yet
         * gathered is looked at again when its oldest has waited the waiter's hold */
        double again = announce(e);
        int n = epoll_wait(e->epoll, events, 64, wait_ms(e, now(), again));
        for (int i = 0; i < n; i++) {
            conn *c = events[i].data.ptr;
            if (c == NULL) { /* the eventfd: new requests, a cancel or stop */
                uint64_t count;
                ssize_t got = read(e->wake, &count, sizeof count);
                (void)got;
                continue;
            }
            if (c->fd < 0) continue; /* closed earlier in this round */
            uint32_t ev = events[i].events;
            if ((ev & EPOLLOUT) && (c->state == C_CONNECTING || c->state == C_SENDING)) {
                on_writable(e, c);
                continue;
            }
            if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(e, c);
        }
        expire(e, now());
    }
    announce(e);
    return NULL;
}

/* ---- Python: Engine ------------------------------------------------------------------------- */

static void secret_free(char **s) {
    if (*s) memset(*s, 0, strlen(*s));
    free(*s);
    *s = NULL;
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"address", "port", "connections", "connect_timeout", "idle_timeout",
                            "region", NULL};
    const char *address, *region;
    int port, connections;
    double connect_timeout, idle_timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "siidds", names, &address, &port, &connections,
                                     &connect_timeout, &idle_timeout, &region))
        return -1;
    if (e->started) {
        PyErr_SetString(PyExc_RuntimeError, "Engine already initialised");
        return -1;
    }
    if (connections < 1 || connections > MAX_CONNECTIONS || port < 1 || port > 65535 ||
        connect_timeout <= 0 || idle_timeout <= 0) {
        PyErr_SetString(PyExc_ValueError, "connections, port or a timeout out of range");
        return -1;
    }
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM};
    struct addrinfo *found = NULL;
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(address, service, &hints, &found) != 0 || found == NULL) {
        PyErr_Format(PyExc_ValueError, "not a numeric address: %s", address);
        return -1;
    }
    memcpy(&e->addr, found->ai_addr, found->ai_addrlen);
    e->addr_len = found->ai_addrlen;
    freeaddrinfo(found);
    e->max_conns = connections;
    e->limit = connections;
    e->want = 1;
    e->connect_timeout = connect_timeout;
    e->idle_timeout = idle_timeout;
    e->region = strdup(region);
    e->conns = calloc((size_t)connections, sizeof(conn));
    e->buffer = malloc(RECV_BUFFER);
    if (!e->region || !e->conns || !e->buffer) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < connections; i++) {
        e->conns[i].fd = -1;
        if ((e->conns[i].p = malloc(sizeof(parser))) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    e->epoll = epoll_create1(EPOLL_CLOEXEC);
    e->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->epoll < 0 || e->wake < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(e->epoll, EPOLL_CTL_ADD, e->wake, &ev);
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&e->ready, &attr);
    pthread_condattr_destroy(&attr);
    int err = pthread_create(&e->thread, NULL, engine_main, e);
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    e->started = 1;
    return 0;
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Engine *e = (Engine *)type->tp_alloc(type, 0);
    if (e) e->epoll = e->wake = -1;
    return (PyObject *)e;
}

static int not_running(Engine *e) {
    if (!e->started || e->closed) {
        PyErr_SetString(PyExc_RuntimeError, "the engine is closed");
        return 1;
    }
    return 0;
}

static PyObject *Engine_submit(Engine *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"tag", "host", "path", "fd", "offset", "length", "total", "range",
                            "if_match", "checksum_mode", NULL};
    PyObject *tag;
    const char *host, *path, *range = NULL, *if_match = NULL;
    int fd, checksum_mode = 0;
    long long offset, length, total;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OssiLLL|zzp", names, &tag, &host, &path, &fd,
                                     &offset, &length, &total, &range, &if_match, &checksum_mode))
        return NULL;
    if (not_running(e)) return NULL;
    if (offset < 0 || length < 0 || total < length || fd < 0) {
        PyErr_SetString(PyExc_ValueError, "fd, offset, length or total out of range");
        return NULL;
    }
    for (const char *s = path; *s; s++) /* no header injection through a path */
        if (*s == '\r' || *s == '\n' || *s == ' ') {
            PyErr_SetString(PyExc_ValueError, "the path must be URI-encoded");
            return NULL;
        }
    request *r = calloc(1, sizeof *r);
    if (r == NULL) return PyErr_NoMemory();
    r->host = strdup(host), r->path = strdup(path);
    r->range = dup_or_null(range), r->if_match = dup_or_null(if_match);
    if (!r->host || !r->path || (range && !r->range) || (if_match && !r->if_match)) {
        request_free(r);
        return PyErr_NoMemory();
    }
    r->fd = fd, r->offset = offset, r->length = length, r->total = total;
    r->checksum_mode = checksum_mode;
    pthread_mutex_lock(&e->lock);
    if (e->stopping) { /* close() from another thread: nothing may be queued behind it */
        pthread_mutex_unlock(&e->lock);
        request_free(r);
        PyErr_SetString(PyExc_RuntimeError, "the engine is closed");
        return NULL;
    }
    Py_INCREF(tag);
    r->tag = tag;
    /* A queue that was not empty needs no wake (an eventfd write here, an epoll round and a
     * read there, per object): the engine was woken for its first request and dispatches in
     * every round, and what it left queued waits for a connection, which only an event of the
     * engine's own (or a raised set_limit, which wakes it) frees. */
    int first = e->queue_head == NULL;
    if (e->queue_tail) e->queue_tail->next = r;
    else e->queue_head = r;
    e->queue_tail = r;
    if (first) e->wakes++;
    pthread_mutex_unlock(&e->lock);
    if (first) wake_engine(e);
    Py_RETURN_NONE;
}

/* A finished request, as wait() hands it over: a tuple whose fields have names. */
static PyStructSequence_Field COMPLETION_FIELDS[] = {
    {"tag", "what submit() was given as tag"},
    {"status", "the HTTP status, or 0 when no answer came"},
    {"err", "an errno, or 0"},
    {"written", "bytes of the body written to the file"},
    {"headers", "the kept response headers, by lower-case name"},
    {"crc", "(algorithm, digest) of a 2xx body, or None"},
    {"body", "a non-2xx answer's body (at most MAX_ERROR_BODY bytes), or None"},
    {NULL, NULL},
};
static PyStructSequence_Desc COMPLETION_DESC = {
    "prefetchd.kernel._http.Completion",
    "A finished request: (tag, status, err, written, headers, crc, body).",
    COMPLETION_FIELDS,
    7,
};
static PyTypeObject *CompletionType;

static PyObject *completion(request *r) {
    PyObject *headers = PyDict_New();
    if (headers == NULL) return NULL;
    for (size_t i = 0; i < N_KEPT; i++) {
        if (r->kept[i] == NULL) continue;
        PyObject *v = PyUnicode_DecodeLatin1(r->kept[i], (Py_ssize_t)strlen(r->kept[i]), NULL);
        if (v == NULL || PyDict_SetItemString(headers, KEPT[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(headers);
            return NULL;
        }
        Py_DECREF(v);
    }
    PyObject *crc;
    if (r->crc_alg != ALG_NONE && r->status >= 200 && r->status < 300 && !r->err) {
        uint8_t digest[4] = {(uint8_t)(r->crc >> 24), (uint8_t)(r->crc >> 16),
                             (uint8_t)(r->crc >> 8), (uint8_t)r->crc};
        crc = Py_BuildValue("(sy#)", r->crc_alg == ALG_CRC32 ? "CRC32" : "CRC32C", digest,
                            (Py_ssize_t)4);
    } else {
        crc = Py_NewRef(Py_None);
    }
    PyObject *body = r->error_body
                         ? PyBytes_FromStringAndSize(r->error_body, (Py_ssize_t)r->error_len)
                         : Py_NewRef(Py_None);
    PyObject *status = PyLong_FromLong(r->status), *err = PyLong_FromLong(r->err);
    PyObject *written = PyLong_FromLongLong((long long)r->written);
    PyObject *out = NULL;
    if (crc && body && status && err && written) out = PyStructSequence_New(CompletionType);
    if (out == NULL) {
        Py_XDECREF(crc), Py_XDECREF(body), Py_XDECREF(status), Py_XDECREF(err);
        Py_XDECREF(written), Py_DECREF(headers);
        return NULL;
    }
    /* SET_ITEM steals each reference */
    PyStructSequence_SET_ITEM(out, 0, Py_NewRef(r->tag));
    PyStructSequence_SET_ITEM(out, 1, status);
    PyStructSequence_SET_ITEM(out, 2, err);
    PyStructSequence_SET_ITEM(out, 3, written);
    PyStructSequence_SET_ITEM(out, 4, headers);
    PyStructSequence_SET_ITEM(out, 5, crc);
    PyStructSequence_SET_ITEM(out, 6, body);
    return out;
}

/* Take every completion (under the lock). */
static request *take_done(Engine *e) {
    request *r = e->done_head;
    e->done_head = e->done_tail = NULL;
    e->done_count = 0;
    return r;
}

static PyObject *completions(request *r) {
    PyObject *list = PyList_New(0);
    while (r) {
        request *next = r->next;
        PyObject *item = list ? completion(r) : NULL;
        if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
        Py_XDECREF(item);
        Py_DECREF(r->tag);
        request_free(r);
        r = next;
    }
    return list;
}

static struct timespec timespec_of(double t) {
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (ts.tv_nsec < 0) ts.tv_nsec = 0;
    return ts;
}

/* wait(timeout, least=1, hold=0.0): the completions queued, once at least `least` are or the
 * oldest has been queued `hold` seconds, waiting up to `timeout` for that; [] if it did not
 * happen by then (what is queued stays for the next call: nothing is dropped). interrupt()
 * makes it return at once with whatever is queued. Meant for one waiting thread at a time;
 * the engine wakes it by the `least` and `hold` of the last wait() to start. */
static PyObject *Engine_wait(Engine *e, PyObject *args) {
    double timeout, hold = 0;
    int least = 1;
    if (!PyArg_ParseTuple(args, "d|id", &timeout, &least, &hold)) return NULL;
    if (!e->started) {
        PyErr_SetString(PyExc_RuntimeError, "the engine was never started");
        return NULL;
    }
    if (least < 1) least = 1;
    if (hold < 0) hold = 0;
    request *r = NULL;
    Py_BEGIN_ALLOW_THREADS
    double start = now();
    double end = start + (timeout > 0 ? timeout : 0);
    pthread_mutex_lock(&e->lock);
    e->want = least, e->hold = hold;
    double t = start;
    int ready;
    while (!(ready = gathered(e, least, hold, t)) && !e->interrupted && t < end) {
        /* the engine broadcasts once `least` are queued or the oldest's hold ended; a batch
         * it announced before this wait() began is timed here */
        double wake = e->done_head && e->done_first_at + hold < end ? e->done_first_at + hold : end;
        struct timespec until = timespec_of(wake);
        int timed_out = pthread_cond_timedwait(&e->ready, &e->lock, &until) == ETIMEDOUT;
        t = now();
        if (timed_out && wake >= end) {
            ready = gathered(e, least, hold, t);
            break;
        }
    }
    if (ready || e->interrupted) r = take_done(e);
    e->interrupted = 0;
    e->want = 1, e->hold = 0;
    pthread_mutex_unlock(&e->lock);
    Py_END_ALLOW_THREADS
    return completions(r);
}

/* set_limit(n): at most n requests on the wire from now on (1 <= n <= connections); those
 * beyond wait in the queue. Lowering it lets the requests already sent finish. */
static PyObject *Engine_set_limit(Engine *e, PyObject *args) {
    int limit;
    if (!PyArg_ParseTuple(args, "i", &limit)) return NULL;
    if (not_running(e)) return NULL;
    if (limit < 1) limit = 1;
    if (limit > e->max_conns) limit = e->max_conns;
    pthread_mutex_lock(&e->lock);
    int raised = limit > e->limit;
    e->limit = limit;
    pthread_mutex_unlock(&e->lock);
    if (raised) wake_engine(e); /* queued requests may go out now */
    Py_RETURN_NONE;
}

static PyObject *Engine_set_credentials(Engine *e, PyObject *args) {
    const char *access, *secret, *token = NULL;
    if (!PyArg_ParseTuple(args, "ss|z", &access, &secret, &token)) return NULL;
    if (not_running(e)) return NULL;
    char *a = strdup(access), *s = strdup(secret), *t = dup_or_null(token);
    if (!a || !s || (token && !t)) {
        secret_free(&a), secret_free(&s), secret_free(&t);
        return PyErr_NoMemory();
    }
    pthread_mutex_lock(&e->lock);
    secret_free(&e->access), secret_free(&e->secret), secret_free(&e->token);
    e->access = a, e->secret = s, e->token = t;
    e->key_valid = 0;
    pthread_mutex_unlock(&e->lock);
    Py_RETURN_NONE;
}

/* Make the current (or next) wait() return at once, with what is done (maybe nothing). */
static PyObject *Engine_interrupt(Engine *e, PyObject *unused) {
    pthread_mutex_lock(&e->lock);
    e->interrupted = 1;
    pthread_cond_broadcast(&e->ready);
    pthread_mutex_unlock(&e->lock);
    Py_RETURN_NONE;
}

static PyObject *Engine_cancel_all(Engine *e, PyObject *unused) {
    if (not_running(e)) return NULL;
    pthread_mutex_lock(&e->lock);
    e->cancelling = 1;
    pthread_mutex_unlock(&e->lock);
    wake_engine(e);
    Py_RETURN_NONE;
}

static void engine_stop(Engine *e) {
    if (!e->started || e->closed) return;
    pthread_mutex_lock(&e->lock);
    e->stopping = 1;
    pthread_mutex_unlock(&e->lock);
    wake_engine(e);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(e->thread, NULL);
    Py_END_ALLOW_THREADS
    e->closed = 1;
    cancel_everything(e); /* what was left becomes ECANCELED completions */
    announce(e);
    for (int i = 0; i < e->max_conns; i++) conn_close(e, &e->conns[i]);
}

static PyObject *Engine_close(Engine *e, PyObject *unused) {
    engine_stop(e);
    Py_RETURN_NONE;
}

static PyObject *Engine_stats(Engine *e, PyObject *unused) {
    pthread_mutex_lock(&e->lock);
    long long connects = e->connects, requests = e->requests, resends = e->resends;
    long long wakes = e->wakes;
    pthread_mutex_unlock(&e->lock);
    long long epoll_calls = __atomic_load_n(&e->epoll_calls, __ATOMIC_RELAXED);
    return Py_BuildValue("{sLsLsLsLsL}", "connects", connects, "requests", requests, "resends",
                         resends, "epoll_calls", epoll_calls, "wakes", wakes);
}

static void Engine_dealloc(Engine *e) {
    engine_stop(e);
    if (e->started) {
        request *r = take_done(e);
        while (r) {
            request *next = r->next;
            Py_DECREF(r->tag);
            request_free(r);
            r = next;
        }
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->ready);
    }
    if (e->conns) {
        for (int i = 0; i < e->max_conns; i++) free(e->conns[i].p);
        free(e->conns);
    }
    if (e->epoll >= 0) close(e->epoll);
    if (e->wake >= 0) close(e->wake);
    free(e->buffer);
    free(e->region);
    secret_free(&e->access), secret_free(&e->secret), secret_free(&e->token);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyMethodDef Engine_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))Engine_submit, METH_VARARGS | METH_KEYWORDS,
     "Queue a GET; its body goes to fd at offset. fd must stay open until its completion."},
    {"wait", (PyCFunction)Engine_wait, METH_VARARGS,
     "The completions queued, once `least` are or the oldest is `hold` seconds old; waiting up "
     "to timeout."},
    {"set_limit", (PyCFunction)Engine_set_limit, METH_VARARGS,
     "At most n requests on the wire (the rest wait in the queue)."},
    {"set_credentials", (PyCFunction)Engine_set_credentials, METH_VARARGS,
     "Sign later requests with these."},
    {"interrupt", (PyCFunction)Engine_interrupt, METH_NOARGS,
     "Make the current or next wait() return at once."},
    {"cancel_all", (PyCFunction)Engine_cancel_all, METH_NOARGS,
     "Complete every queued and in-flight request with ECANCELED."},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "Stop and join the engine thread."},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS,
     "Connections opened, requests, resends, epoll_ctl calls, wakes by submit()."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prefetchd.kernel._http.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One epoll thread of keep-alive GET connections to one address.",
    .tp_new = Engine_new,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

/* ---- Python: pure functions (tests) --------------------------------------------------------- */

/* sign(host, path, headers, amz_date, region, access, secret) -> Authorization value.
 * `headers`: (lower-case name, value) pairs besides host. */
static PyObject *py_sign(PyObject *self, PyObject *args) {
    const char *host, *path, *amz_date, *region, *access, *secret;
    PyObject *pairs;
    if (!PyArg_ParseTuple(args, "ssO!ssss", &host, &path, &PyList_Type, &pairs, &amz_date, &region,
                          &access, &secret))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    if (n > 30 || strlen(amz_date) != 16) {
        PyErr_SetString(PyExc_ValueError, "too many headers or a bad amz_date");
        return NULL;
    }
    header h[32];
    h[0] = (header){"host", host};
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name, *value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(pairs, i), "ss", &name, &value)) return NULL;
        h[i + 1] = (header){name, value};
    }
    char date[9];
    memcpy(date, amz_date, 8);
    date[8] = 0;
    uint8_t key[32];
    signing_key(secret, date, region, key);
    str out = {0};
    if (authorization(&out, path, h, (size_t)n + 1, amz_date, region, access, key) < 0) {
        free(out.p);
        return PyErr_NoMemory();
    }
    PyObject *result = PyUnicode_FromString(out.p);
    free(out.p);
    return result;
}

static PyObject *py_sha256(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    sha256 s;
    uint8_t out[32];
    sha256_init(&s);
    sha256_update(&s, b.buf, (size_t)b.len);
    sha256_final(&s, out);
    PyBuffer_Release(&b);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

typedef struct {
    str body;
    int64_t length, total;
    int refused;
} memory_sink;

static int memory_head(void *ctx, parser *p) {
    memory_sink *m = ctx;
    int64_t total = -1;
    if (p->kept[H_RANGE]) {
        const char *slash = strrchr(p->kept[H_RANGE], '/');
        total = slash ? decimal(slash + 1) : -1;
    } else {
        total = p->content_length;
    }
    if (p->status >= 200 && p->status < 300 && m->length >= 0 &&
        ((p->content_length >= 0 && p->content_length != m->length) ||
         (total >= 0 && total != m->total)))
        return EMSGSIZE;
    return 0;
}

static int memory_body(void *ctx, const char *data, size_t n) {
    memory_sink *m = ctx;
    if (m->body.len + n > 16 * 1024 * 1024) return EFBIG;
    str_add(&m->body, data, n);
    return m->body.failed ? ENOMEM : 0;
}

/* parse(pieces, length, total, eof) -> (errno, status, done, headers, body): the parser fed
 * `pieces` one at a time, as recv() would; `eof` ends a close-delimited body. For tests and
 * the fuzzer. */
static PyObject *py_parse(PyObject *self, PyObject *args) {
    PyObject *pieces;
    long long length, total;
    int eof;
    if (!PyArg_ParseTuple(args, "O!LLp", &PyList_Type, &pieces, &length, &total, &eof)) return NULL;
    parser *p = malloc(sizeof *p);
    if (p == NULL) return PyErr_NoMemory();
    parser_reset(p);
    memory_sink m = {{0}, length, total, 0};
    parser_calls calls = {memory_head, memory_body};
    int err = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pieces) && !err; i++) {
        PyObject *piece = PyList_GET_ITEM(pieces, i);
        if (!PyBytes_Check(piece)) {
            free(m.body.p), free(p);
            PyErr_SetString(PyExc_TypeError, "pieces must be bytes");
            return NULL;
        }
        err = parser_feed(p, &calls, &m, PyBytes_AS_STRING(piece), (size_t)PyBytes_GET_SIZE(piece));
    }
    int done = p->phase == P_DONE || (eof && !err && p->phase == P_BODY_EOF);
    PyObject *headers = PyDict_New();
    for (size_t i = 0; headers && i < N_KEPT; i++) {
        if (p->phase == P_HEAD || p->kept[i] == NULL) continue;
        PyObject *v = PyUnicode_DecodeLatin1(p->kept[i], (Py_ssize_t)strlen(p->kept[i]), NULL);
        if (v == NULL || PyDict_SetItemString(headers, KEPT[i], v) < 0) Py_CLEAR(headers);
        Py_XDECREF(v);
    }
    PyObject *out = NULL;
    if (headers)
        out = Py_BuildValue("(iiiOy#)", err, p->status, done, headers, m.body.p ? m.body.p : "",
                            (Py_ssize_t)m.body.len);
    Py_XDECREF(headers);
    free(m.body.p);
    free(p);
    return out;
}

static PyObject *py_set_crc32c(PyObject *self, PyObject *arg) {
    void *address = PyLong_AsVoidPtr(arg);
    if (address == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a NULL crc32c_extend");
        return NULL;
    }
    crc32c_extend = (crc_extend_fn)address;
    Py_RETURN_NONE;
}

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &crc)) return NULL;
    uint32_t value = crc32_update(crc, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(value);
}

static PyMethodDef module_methods[] = {
    {"sign", py_sign, METH_VARARGS, "The SigV4 Authorization value of a GET (UNSIGNED-PAYLOAD)."},
    {"sha256", py_sha256, METH_O, "SHA-256 of a buffer (tests)."},
    {"crc32", py_crc32, METH_VARARGS, "zlib.crc32's value, as the engine takes it (tests)."},
    {"parse", py_parse, METH_VARARGS, "Feed the response parser (tests, fuzzing)."},
    {"set_crc32c", py_set_crc32c, METH_O, "Use the crc32c_extend at this address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_http", .m_doc = "The native GET client's engine.",
    .m_size = -1, .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__http(void) {
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
    clmul = 0;
#endif
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    CompletionType = PyStructSequence_NewType(&COMPLETION_DESC);
    if (CompletionType == NULL || PyModule_AddObject(m, "Completion", Py_NewRef(CompletionType)) < 0) {
        Py_XDECREF(CompletionType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_HEAD", MAX_HEAD);
    PyModule_AddIntConstant(m, "MAX_ERROR_BODY", MAX_ERROR_BODY);
    return m;
}
