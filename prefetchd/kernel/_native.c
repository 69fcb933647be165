/* prefetchd.kernel._native: the record kernel's per-record loops, one call per batch of records
 * (for the writer's formats and mixing, and the downloader's check of TFRecord objects).
 *
 * Every function here has a pure-Python twin in prefetchd/kernel/twin.py that gives the same
 * bytes for the same input (both satisfy prefetchd/kernel/protocol.py's RecordKernel);
 * prefetchd/kernel/choice.py picks one of the two at import. The contract of each function is
 * documented in twin.py, once.
 *
 * A batch of frames is two buffers: `data`, TFRecord frames back to back, and `ends`, the
 * native uint64 end offset of each frame in `data`. Orders and picks are native uint32.
 *
 * CRC32C is not implemented here: set_crc32c() is given the address of a vetted
 * crc32c_extend(crc, data, len) (Google's libcrc32c, bundled with the google-crc32c wheel)
 * and every function that frames or checks records refuses to run before it is set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef uint32_t (*crc_extend_fn)(uint32_t, const uint8_t *, size_t);
static crc_extend_fn crc_extend = NULL;

#define MASK_DELTA 0xA282EAD8u
#define HEADER 12
#define OVERHEAD 16

static uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = crc_extend(0, p, n);
    return ((c >> 15) | (c << 17)) + MASK_DELTA;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The 12-byte TFRecord header of a record of `n` bytes. */
static void put_header(uint8_t *p, uint64_t n) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(n >> (8 * i));
    put_u32(p + 8, masked_crc(p, 8));
}

static int need_crc(void) {
    if (crc_extend == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_crc32c() was not called");
        return 0;
    }
    return 1;
}

/* Raise ValueError(offset, reason): the twin raises FramingError with the same arguments. */
static PyObject *framing_error(uint64_t offset, const char *reason) {
    PyObject *args = Py_BuildValue("(Ks)", (unsigned long long)offset, reason);
    if (args != NULL) {
        PyErr_SetObject(PyExc_ValueError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* Raise the framing error of a frame at `offset` whose data and footer are not all there. */
static PyObject *truncated_error(uint64_t offset, uint64_t length) {
    PyObject *msg = PyUnicode_FromFormat("truncated record (expected %llu bytes of data)",
                                         (unsigned long long)length);
    if (msg != NULL) {
        framing_error(offset, PyUnicode_AsUTF8(msg));
        Py_DECREF(msg);
    }
    return NULL;
}

/* --- protobuf: tf.train.Example with bytes and int64 features -------------------------- */

typedef struct {
    const char *name;
    size_t name_len;
    int is_int;
    uint64_t ival;
    const uint8_t *data;
    size_t len;
    uint8_t **hole; /* set: the value is not copied, its `len` bytes are left for the caller,
                       who learns where here (frame_file_example) */
} feature_t;

static size_t vlen(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static size_t field_len(size_t payload) { return 1 + vlen(payload) + payload; }

static size_t value_len(const feature_t *f) { return f->is_int ? vlen(f->ival) : f->len; }

static size_t feature_len(const feature_t *f) { return field_len(field_len(value_len(f))); }

static size_t entry_len(const feature_t *f) {
    return field_len(f->name_len) + field_len(feature_len(f));
}

static size_t features_len(const feature_t *fs, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += field_len(entry_len(&fs[i]));
    return total;
}

/* Size of the serialized Example; features must be sorted by name, as the twin sorts them. */
static size_t example_len(const feature_t *fs, int n) { return field_len(features_len(fs, n)); }

static uint8_t *put_feature(uint8_t *p, const feature_t *f) {
    size_t value = value_len(f);
    *p++ = f->is_int ? 0x1A : 0x0A; /* Int64List = 3, BytesList = 1 */
    p = put_varint(p, field_len(value));
    *p++ = 0x0A; /* repeated value = 1 */
    p = put_varint(p, value);
    if (f->is_int) return put_varint(p, f->ival);
    if (f->hole != NULL) {
        *f->hole = p;
        return p + f->len;
    }
    memcpy(p, f->data, f->len);
    return p + f->len;
}

static uint8_t *put_example(uint8_t *p, const feature_t *fs, int n) {
    *p++ = 0x0A; /* Example.features = 1 */
    p = put_varint(p, features_len(fs, n));
    for (int i = 0; i < n; i++) {
        const feature_t *f = &fs[i];
        *p++ = 0x0A; /* Features.feature = 1 (a map entry) */
        p = put_varint(p, entry_len(f));
        *p++ = 0x0A; /* entry key = 1 */
        p = put_varint(p, f->name_len);
        memcpy(p, f->name, f->name_len);
        p += f->name_len;
        *p++ = 0x12; /* entry value = 2 */
        p = put_varint(p, feature_len(f));
        p = put_feature(p, f);
    }
    return p;
}

/* Frame the Example `fs` at `p`: header, Example, masked CRC of the Example. */
static uint8_t *put_example_frame(uint8_t *p, const feature_t *fs, int n, size_t len) {
    uint8_t *body = p + HEADER;
    put_header(p, len);
    uint8_t *end = put_example(body, fs, n);
    put_u32(end, masked_crc(body, len));
    return end + 4;
}

/* --- output buffers ---------------------------------------------------------------------- */

/* A bytes object of `data_len` and one of `count` uint64 ends, or NULL with an exception. */
static int new_batch(Py_ssize_t data_len, Py_ssize_t count, PyObject **data, PyObject **ends) {
    *data = PyBytes_FromStringAndSize(NULL, data_len);
    *ends = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(uint64_t));
    if (*data == NULL || *ends == NULL) {
        Py_CLEAR(*data);
        Py_CLEAR(*ends);
        return 0;
    }
    return 1;
}

static uint8_t *bytes_of(PyObject *b) { return (uint8_t *)PyBytes_AS_STRING(b); }

static uint64_t *ends_of(PyObject *b) { return (uint64_t *)PyBytes_AS_STRING(b); }

/* --- lines ------------------------------------------------------------------------------- */

static const char NAME_DATA[] = "data", NAME_KEY[] = "key", NAME_LINE[] = "line_number";

/* Find the line at `pos`: [pos, *line_end) without "\n" and one "\r"; *next after the "\n".
 * Returns 0 when no complete line starts at `pos` (and `final` is false). */
static int next_line(const uint8_t *buf, size_t len, size_t pos, int final, size_t *line_end,
                     size_t *next) {
    const uint8_t *nl = memchr(buf + pos, '\n', len - pos);
    size_t end;
    if (nl != NULL) {
        end = (size_t)(nl - buf);
        *next = end + 1;
    } else if (final && pos < len) {
        end = len;
        *next = len;
    } else {
        return 0;
    }
    if (end > pos && buf[end - 1] == '\r') end--;
    *line_end = end;
    return 1;
}

static void line_features(feature_t *fs, const uint8_t *data, size_t len, Py_buffer *key,
                          uint64_t number) {
    fs[0] = (feature_t){NAME_DATA, 4, 0, 0, data, len, NULL};
    fs[1] = (feature_t){NAME_KEY, 3, 0, 0, key->buf, (size_t)key->len, NULL};
    fs[2] = (feature_t){NAME_LINE, 11, 1, number, NULL, 0, NULL};
}

static PyObject *frame_lines(PyObject *self, PyObject *args) {
    Py_buffer buf, key;
    unsigned long long first;
    int final;
    if (!need_crc() || !PyArg_ParseTuple(args, "y*y*Kp", &buf, &key, &first, &final))
        return NULL;
    const uint8_t *b = buf.buf;
    size_t len = (size_t)buf.len, pos = 0, end, next, total = 0;
    Py_ssize_t count = 0;
    uint64_t number = first;
    feature_t fs[3];
    while (next_line(b, len, pos, final, &end, &next)) { /* pass 1: sizes */
        if (end > pos) {
            line_features(fs, b + pos, end - pos, &key, number);
            total += OVERHEAD + example_len(fs, 3);
            count++;
        }
        number++;
        pos = next;
    }
    PyObject *data, *ends;
    if (!new_batch((Py_ssize_t)total, count, &data, &ends)) goto fail;
    uint8_t *out = bytes_of(data), *start = out;
    uint64_t *e = ends_of(ends);
    pos = 0;
    number = first;
    while (next_line(b, len, pos, final, &end, &next)) { /* pass 2: frames */
        if (end > pos) {
            line_features(fs, b + pos, end - pos, &key, number);
            out = put_example_frame(out, fs, 3, example_len(fs, 3));
            *e++ = (uint64_t)(out - start);
        }
        number++;
        pos = next;
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&key);
    return Py_BuildValue("(NNnK)", data, ends, (Py_ssize_t)pos, (unsigned long long)number);
fail:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&key);
    return NULL;
}

/* --- framing given payloads -------------------------------------------------------------- */

static PyObject *frame_records(PyObject *self, PyObject *arg) {
    if (!need_crc()) return NULL;
    PyObject *seq = PySequence_Fast(arg, "frame_records() takes a sequence of bytes");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(items[i])) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "frame_records() takes bytes only");
            return NULL;
        }
        total += OVERHEAD + PyBytes_GET_SIZE(items[i]);
    }
    PyObject *data, *ends;
    if (!new_batch(total, n, &data, &ends)) {
        Py_DECREF(seq);
        return NULL;
    }
    uint8_t *out = bytes_of(data), *start = out;
    uint64_t *e = ends_of(ends);
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)PyBytes_GET_SIZE(items[i]);
        put_header(out, len);
        memcpy(out + HEADER, PyBytes_AS_STRING(items[i]), len);
        put_u32(out + HEADER + len, masked_crc(out + HEADER, len));
        out += OVERHEAD + len;
        *e++ = (uint64_t)(out - start);
    }
    Py_DECREF(seq);
    return Py_BuildValue("(NN)", data, ends);
}

/* --- framing given Examples ------------------------------------------------------------ */

/* Fill `fs` from a list of (name: bytes, value: bytes | int) sorted by name. With `hole`, one
 * value may be None instead: a bytes value of `hole_len` bytes that the caller fills in. */
static int sample_features(PyObject *sample, feature_t *fs, Py_ssize_t n, uint8_t **hole,
                           size_t hole_len) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(sample, i), *name, *value;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "features are (name, value) tuples");
            return 0;
        }
        name = PyTuple_GET_ITEM(item, 0);
        value = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "feature names are bytes");
            return 0;
        }
        fs[i] = (feature_t){PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name), 0, 0, NULL, 0, NULL};
        if (PyBytes_Check(value)) {
            fs[i].data = (const uint8_t *)PyBytes_AS_STRING(value);
            fs[i].len = (size_t)PyBytes_GET_SIZE(value);
        } else if (value == Py_None && hole != NULL) {
            fs[i].hole = hole;
            fs[i].len = hole_len;
            hole = NULL; /* one at most */
        } else if (PyLong_Check(value) && !PyBool_Check(value)) {
            long long v = PyLong_AsLongLong(value);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "int64 feature out of range: %R", value);
                return 0;
            }
            fs[i].is_int = 1;
            fs[i].ival = (uint64_t)v; /* int64 is encoded as its two's complement */
        } else {
            PyErr_Format(PyExc_TypeError, "unsupported feature value type %s",
                         Py_TYPE(value)->tp_name);
            return 0;
        }
    }
    return 1;
}

static PyObject *frame_examples(PyObject *self, PyObject *arg) {
    if (!need_crc()) return NULL;
    if (!PyList_Check(arg)) return PyErr_Format(PyExc_TypeError, "a list of samples");
    Py_ssize_t n = PyList_GET_SIZE(arg), total = 0, most = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sample = PyList_GET_ITEM(arg, i);
        if (!PyList_Check(sample)) return PyErr_Format(PyExc_TypeError, "a sample is a list");
        if (PyList_GET_SIZE(sample) > most) most = PyList_GET_SIZE(sample);
    }
    feature_t *fs = PyMem_Malloc(sizeof(feature_t) * (size_t)(most ? most : 1));
    if (fs == NULL) return PyErr_NoMemory();
    PyObject *data = NULL, *ends = NULL;
    for (Py_ssize_t i = 0; i < n; i++) { /* pass 1: sizes, and every value checked */
        PyObject *sample = PyList_GET_ITEM(arg, i);
        Py_ssize_t k = PyList_GET_SIZE(sample);
        if (!sample_features(sample, fs, k, NULL, 0)) goto fail;
        total += OVERHEAD + (Py_ssize_t)example_len(fs, (int)k);
    }
    if (!new_batch(total, n, &data, &ends)) goto fail;
    uint8_t *out = bytes_of(data), *base = out;
    uint64_t *e = ends_of(ends);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sample = PyList_GET_ITEM(arg, i);
        int k = (int)PyList_GET_SIZE(sample);
        sample_features(sample, fs, k, NULL, 0);
        out = put_example_frame(out, fs, k, example_len(fs, k));
        *e++ = (uint64_t)(out - base);
    }
    PyMem_Free(fs);
    return Py_BuildValue("(NN)", data, ends);
fail:
    PyMem_Free(fs);
    return NULL;
}

/* One sample whose None value is the `size` bytes of file `fd` (from offset 0), framed as
 * frame_examples() frames it with those bytes as that value. The bytes are read straight into
 * the frame, without the GIL: no copy of them in between, no allocation of their own. None if
 * the file does not hold exactly `size` bytes (the caller reads it the general way). */
static PyObject *frame_file_example(PyObject *self, PyObject *args) {
    PyObject *sample, *data = NULL, *ends = NULL;
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "O!in", &PyList_Type, &sample, &fd, &size)) return NULL;
    if (!need_crc()) return NULL;
    if (size < 0) return PyErr_Format(PyExc_ValueError, "negative size");
    Py_ssize_t k = PyList_GET_SIZE(sample);
    feature_t *fs = PyMem_Malloc(sizeof(feature_t) * (size_t)(k ? k : 1));
    if (fs == NULL) return PyErr_NoMemory();
    uint8_t *hole = NULL;
    if (!sample_features(sample, fs, k, &hole, (size_t)size)) goto fail;
    int has_hole = 0;
    for (Py_ssize_t i = 0; i < k; i++) has_hole |= fs[i].hole != NULL;
    if (!has_hole) {
        PyErr_SetString(PyExc_TypeError, "frame_file_example() needs one None value");
        goto fail;
    }
    size_t len = example_len(fs, (int)k);
    if (!new_batch(OVERHEAD + (Py_ssize_t)len, 1, &data, &ends)) goto fail;
    uint8_t *body = bytes_of(data) + HEADER;
    put_header(bytes_of(data), len);
    uint8_t *end = put_example(body, fs, (int)k);
    PyMem_Free(fs);
    fs = NULL;
    /* Ask for one byte more than `size`, to learn without another call whether the file grew:
     * it lands on the byte after the hole (there is one: at least the CRC follows), which is
     * put back. Done once `size` bytes are in: a regular file's read is short only at its end,
     * so a read that stopped there found the end (asking again was a pread of 1 byte per
     * object that always answered 0), and one that went past it found the file grew. */
    uint8_t after = hole[size];
    size_t want = (size_t)size + 1, got = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (got < want) {
        ssize_t r = pread(fd, hole + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            err = errno;
            break;
        }
        if (r == 0) break;
        got += (size_t)r;
        if (got >= (size_t)size) break;
    }
    if (!err && got == (size_t)size) {
        hole[size] = after;
        put_u32(end, masked_crc(body, len));
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    if (got != (size_t)size) {
        Py_DECREF(data);
        Py_DECREF(ends);
        Py_RETURN_NONE;
    }
    *ends_of(ends) = (uint64_t)(OVERHEAD + len);
    return Py_BuildValue("(NN)", data, ends);
fail:
    PyMem_Free(fs);
    Py_XDECREF(data);
    Py_XDECREF(ends);
    return NULL;
}

/* --- tar (WebDataset): the samples of a chunk of the tar stream ---------------------------- */

#define BLOCK 512
#define TAR_SKIP_LIMIT (1 << 20) /* a larger member without extension: tarfile streams past it */
#define TAR_MAX_SIZE ((uint64_t)1 << 62)
#define TAR_END 0
#define TAR_FALLBACK (-1)
#define TAR_ERROR (-2) /* a Python exception is set */

static const char NAME_TAR_KEY[] = "key";
static const uint16_t TAR_NUMBERS[][2] = {{100, 8}, {108, 8}, {116, 8}, {136, 12}, {329, 8}, {337, 8}};

typedef struct {
    uint8_t key[256]; /* prefix (155) + "/" + name (100) at most */
    size_t key_len, first, count; /* its features: features[first .. first + count) */
} tar_sample_t;

typedef struct {
    tar_sample_t *samples;
    feature_t *features;
    size_t nsamples, nfeatures, cap_samples, cap_features;
} tar_scan_t;

typedef struct {
    uint64_t size;
    int regular; /* tarfile's isreg(): its data follows the header and it may be a sample file */
    const uint8_t *name, *prefix;
    size_t name_len, prefix_len;
} tar_header_t;

enum { TAR_MEMBER, TAR_ZEROS, TAR_UNKNOWN };

static size_t text_len(const uint8_t *p, size_t n) {
    const uint8_t *nul = memchr(p, 0, n);
    return nul ? (size_t)(nul - p) : n;
}

/* A number field as tarfile's nti() reads it. Returns 0 for a form left to tarfile: anything
 * but positive base-256 below TAR_MAX_SIZE, or spaces, octal digits, spaces up to a NUL. */
static int tar_number(const uint8_t *f, size_t n, uint64_t *value) {
    uint64_t v = 0;
    if (f[0] == 0x80) {
        for (size_t i = 1; i < n; i++) {
            if (v >> 54) return 0;
            v = v << 8 | f[i];
        }
        *value = v;
        return 1;
    }
    size_t len = text_len(f, n), i = 0;
    while (i < len && f[i] == ' ') i++;
    while (i < len && f[i] >= '0' && f[i] <= '7') v = v << 3 | (uint64_t)(f[i++] - '0');
    while (i < len && f[i] == ' ') i++;
    *value = v;
    return i == len;
}

/* The sum of the bytes of `h` (BLOCK of them) and how many have their high bit set, eight
 * bytes at a time in lanes: sums in 16-bit lanes (64 words add at most 64 * 2 * 255 to one),
 * high bits in 8-bit lanes (at most 64 each). GCC at -O2 does not vectorize the plain byte loop,
 * which was most of the cost of walking a tar of small members. */
static void block_sums(const uint8_t *h, uint32_t *sum, uint32_t *high) {
    const uint64_t low_bytes = 0x00FF00FF00FF00FFull, ones = 0x0101010101010101ull;
    uint64_t sums = 0, highs = 0, w;
    for (int i = 0; i < BLOCK; i += 8) {
        memcpy(&w, h + i, 8); /* any alignment: a chunk may start anywhere */
        sums += (w & low_bytes) + ((w >> 8) & low_bytes);
        highs += (w >> 7) & ones;
    }
    sums = (sums & 0x0000FFFF0000FFFFull) + ((sums >> 16) & 0x0000FFFF0000FFFFull);
    *sum = (uint32_t)((sums & 0xFFFFFFFFull) + (sums >> 32));
    highs = (highs & low_bytes) + ((highs >> 8) & low_bytes); /* 16-bit lanes: up to 512 */
    *high = (uint32_t)((highs * 0x0001000100010001ull) >> 48);
}

/* tarfile's check: the stored checksum is the unsigned or the signed sum of the header's bytes,
 * the checksum field counted as eight spaces. */
static int tar_checksum_ok(const uint8_t *h, uint64_t stored) {
    uint32_t sum, high;
    block_sums(h, &sum, &high);
    for (int i = 148; i < 156; i++) { /* the field itself counts as spaces */
        sum -= h[i];
        high -= h[i] >> 7;
    }
    sum += 8 * ' ';
    return stored == sum || stored == (uint64_t)sum - 256 * (uint64_t)high;
}

/* Read the header at `h` as tarfile's frombuf() does, for the forms this parser knows. */
static int tar_header(const uint8_t *h, tar_header_t *t) {
    static const uint8_t zeros[BLOCK];
    uint64_t stored, ignored;
    if (h[0] == 0 && memcmp(h, zeros, BLOCK) == 0) return TAR_ZEROS; /* a name: not zeros */
    if (!tar_number(h + 148, 8, &stored) || !tar_checksum_ok(h, stored)) return TAR_UNKNOWN;
    if (!tar_number(h + 124, 12, &t->size)) return TAR_UNKNOWN;
    for (size_t i = 0; i < sizeof TAR_NUMBERS / sizeof TAR_NUMBERS[0]; i++)
        if (!tar_number(h + TAR_NUMBERS[i][0], TAR_NUMBERS[i][1], &ignored)) return TAR_UNKNOWN;
    t->name = h;
    t->name_len = text_len(h, 100);
    t->prefix = h + 345;
    t->prefix_len = text_len(h + 345, 155);
    uint8_t type = h[156];
    int v7_dir = type == 0 && t->name_len > 0 && h[t->name_len - 1] == '/';
    if (type == '0' || type == '7' || (type == 0 && !v7_dir))
        t->regular = 1;
    else if ((type >= '1' && type <= '6') || v7_dir)
        t->regular = 0; /* links, devices, directories: tarfile skips no data after them */
    else
        return TAR_UNKNOWN; /* pax, GNU long names, sparse files, vendor types */
    return TAR_MEMBER;
}

/* split_member() of the name tarfile gives (prefix + "/" + name when the prefix is set): the
 * sample key (posixpath.join of the directory and the base) into `key`, and the extension, a
 * suffix of the name field. Returns 0 when the name has no extension. */
static int tar_split(const tar_header_t *t, uint8_t *key, size_t *key_len, const uint8_t **ext,
                     size_t *ext_len) {
    uint8_t full[256];
    size_t n = 0;
    if (t->prefix_len) {
        memcpy(full, t->prefix, t->prefix_len);
        n = t->prefix_len;
        full[n++] = '/';
    }
    memcpy(full + n, t->name, t->name_len);
    n += t->name_len;
    size_t tail = n, head;
    while (tail > 0 && full[tail - 1] != '/') tail--;
    const uint8_t *dot = memchr(full + tail, '.', n - tail);
    if (dot == NULL || dot == full + tail || dot == full + n - 1) return 0;
    for (head = tail; head > 0 && full[head - 1] == '/'; head--) {
    }
    if (head > 0) { /* posixpath strips the directory's trailing slashes, then joins with one */
        memcpy(key, full, head);
        key[head++] = '/';
    } else { /* ... unless the directory is only slashes */
        memcpy(key, full, tail);
        head = tail;
    }
    size_t base = (size_t)(dot - (full + tail));
    memcpy(key + head, full + tail, base);
    *key_len = head + base;
    *ext_len = n - (size_t)(dot + 1 - full);
    *ext = t->name + t->name_len - *ext_len;
    return 1;
}

static int grow(void **items, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return 1;
    size_t more = *cap ? *cap * 2 : 64;
    void *grown = PyMem_Realloc(*items, more * size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    *items = grown;
    *cap = more;
    return 1;
}

static int tar_room(tar_scan_t *s) {
    return grow((void **)&s->samples, &s->cap_samples, s->nsamples, sizeof(tar_sample_t)) &&
           grow((void **)&s->features, &s->cap_features, s->nfeatures, sizeof(feature_t));
}

/* A new sample with its `key` feature (whose data is pointed at once the arrays stop moving). */
static int tar_open_sample(tar_scan_t *s, const uint8_t *key, size_t key_len) {
    if (!tar_room(s)) return 0;
    tar_sample_t *sample = &s->samples[s->nsamples++];
    memcpy(sample->key, key, key_len);
    sample->key_len = key_len;
    sample->first = s->nfeatures;
    sample->count = 1;
    s->features[s->nfeatures++] = (feature_t){NAME_TAR_KEY, 3, 0, 0, NULL, key_len, NULL};
    return 1;
}

static int tar_add(tar_scan_t *s, const uint8_t *ext, size_t ext_len, const uint8_t *data,
                   size_t len) {
    if (!tar_room(s)) return 0;
    s->features[s->nfeatures++] = (feature_t){(const char *)ext, ext_len, 0, 0, data, len, NULL};
    s->samples[s->nsamples - 1].count++;
    return 1;
}

static int tar_has(const tar_scan_t *s, const uint8_t *ext, size_t ext_len) {
    const tar_sample_t *sample = &s->samples[s->nsamples - 1];
    for (size_t i = sample->first + 1; i < sample->first + sample->count; i++)
        if (s->features[i].name_len == ext_len && memcmp(s->features[i].name, ext, ext_len) == 0)
            return 1;
    return 0;
}

static int tar_ext_ok(const uint8_t *ext, size_t n) {
    if (n == 3 && memcmp(ext, NAME_TAR_KEY, 3) == 0) return 0; /* tarfile path: "reserved" */
    for (size_t i = 0; i < n; i++)
        if (ext[i] >= 0x80 || ext[i] == '%')
            return 0; /* non-ASCII or escaped feature names (formats/tar.py): the tarfile path */
    return 1;
}

/* Scan `b` for samples (see twin.frame_tar). Fills `s` with the complete samples; returns
 * the status and sets *consumed. */
static Py_ssize_t tar_scan(tar_scan_t *s, const uint8_t *b, size_t len, int final, int at_start,
                           size_t *consumed) {
    size_t pos = 0, open_at = 0, key_len, ext_len;
    int open = 0;
    tar_header_t t;
    uint8_t key[256];
    const uint8_t *ext;
    Py_ssize_t status = TAR_END;
    *consumed = len;
    for (;;) {
        if (len - pos < BLOCK) {
            if (!final) {
                *consumed = open ? open_at : pos;
                status = (Py_ssize_t)(pos + BLOCK - *consumed);
            } else if (pos == 0 && at_start) {
                status = TAR_FALLBACK; /* tarfile: "empty file" or "truncated header" */
            }
            break; /* else tarfile ends the archive quietly at a short header */
        }
        int kind = tar_header(b + pos, &t);
        if (kind == TAR_ZEROS) break;
        if (kind == TAR_UNKNOWN || t.size > TAR_MAX_SIZE) {
            status = TAR_FALLBACK;
            break;
        }
        if (!t.regular) {
            pos += BLOCK;
            continue;
        }
        size_t end = pos + BLOCK + (size_t)((t.size + BLOCK - 1) / BLOCK * BLOCK);
        int sample_file = tar_split(&t, key, &key_len, &ext, &ext_len);
        if (!sample_file && t.size > TAR_SKIP_LIMIT) {
            status = TAR_FALLBACK;
            break;
        }
        if (sample_file && !tar_ext_ok(ext, ext_len)) {
            status = TAR_FALLBACK;
            break;
        }
        if (sample_file && (!open || key_len != s->samples[s->nsamples - 1].key_len ||
                            memcmp(key, s->samples[s->nsamples - 1].key, key_len) != 0)) {
            if (!tar_open_sample(s, key, key_len)) return TAR_ERROR; /* the last one is complete */
            open = 1;
            open_at = pos;
        } else if (sample_file && tar_has(s, ext, ext_len)) {
            status = TAR_FALLBACK; /* tarfile path: "appears twice in sample" */
            break;
        }
        if (end > len) {
            if (final) {
                status = TAR_FALLBACK; /* tarfile: "unexpected end of data" */
            } else {
                *consumed = open ? open_at : pos;
                status = (Py_ssize_t)(end + BLOCK - *consumed);
            }
            break;
        }
        if (sample_file && !tar_add(s, ext, ext_len, b + pos + BLOCK, (size_t)t.size))
            return TAR_ERROR;
        pos = end;
    }
    if (open && status != TAR_END) s->nfeatures = s->samples[--s->nsamples].first;
    return status;
}

static int feature_before(const feature_t *a, const feature_t *b) {
    size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, n);
    return c < 0 || (c == 0 && a->name_len < b->name_len);
}

/* Sort a sample's features by name, as encode_example sorts them (a few: insertion sort). */
static void sort_features(feature_t *fs, size_t n) {
    for (size_t i = 1; i < n; i++) {
        feature_t f = fs[i];
        size_t j = i;
        for (; j > 0 && feature_before(&f, &fs[j - 1]); j--) fs[j] = fs[j - 1];
        fs[j] = f;
    }
}

/* The scanned samples as a batch of Example frames. */
static int tar_batch(tar_scan_t *s, PyObject **data, PyObject **ends) {
    Py_ssize_t total = 0;
    for (size_t i = 0; i < s->nsamples; i++) { /* pass 1: keys in place, order, sizes */
        tar_sample_t *sample = &s->samples[i];
        feature_t *fs = &s->features[sample->first];
        fs[0].data = sample->key;
        sort_features(fs, sample->count);
        total += OVERHEAD + (Py_ssize_t)example_len(fs, (int)sample->count);
    }
    if (!new_batch(total, (Py_ssize_t)s->nsamples, data, ends)) return 0;
    uint8_t *out = bytes_of(*data), *base = out;
    uint64_t *e = ends_of(*ends);
    for (size_t i = 0; i < s->nsamples; i++) { /* pass 2: frames */
        feature_t *fs = &s->features[s->samples[i].first];
        int n = (int)s->samples[i].count;
        out = put_example_frame(out, fs, n, example_len(fs, n));
        *e++ = (uint64_t)(out - base);
    }
    return 1;
}

static PyObject *frame_tar(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int final, at_start;
    if (!need_crc() || !PyArg_ParseTuple(args, "y*pp", &buf, &final, &at_start)) return NULL;
    tar_scan_t s = {NULL, NULL, 0, 0, 0, 0};
    size_t consumed;
    PyObject *result = NULL, *data, *ends;
    Py_ssize_t status = tar_scan(&s, buf.buf, (size_t)buf.len, final, at_start, &consumed);
    if (status != TAR_ERROR && tar_batch(&s, &data, &ends))
        result = Py_BuildValue("(NNnn)", data, ends, (Py_ssize_t)consumed, status);
    PyMem_Free(s.samples);
    PyMem_Free(s.features);
    PyBuffer_Release(&buf);
    return result;
}

/* check_tar(buf, final, at_start) -> (samples, largest, consumed, status): frame_tar's walk,
 * every rule and status the same, without the frames: the count of complete samples and the
 * size of the largest frame frame_tar would make (0 with none). No copy, no CRC: the writer's
 * read-through of an object before its first record is taken needs only the verdict. */
static PyObject *check_tar(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int final, at_start;
    if (!PyArg_ParseTuple(args, "y*pp", &buf, &final, &at_start)) return NULL;
    tar_scan_t s = {NULL, NULL, 0, 0, 0, 0};
    size_t consumed, largest = 0;
    PyObject *result = NULL;
    Py_ssize_t status = tar_scan(&s, buf.buf, (size_t)buf.len, final, at_start, &consumed);
    if (status != TAR_ERROR) {
        for (size_t i = 0; i < s.nsamples; i++) { /* a length is the same in any feature order */
            size_t n = OVERHEAD + example_len(&s.features[s.samples[i].first],
                                              (int)s.samples[i].count);
            if (n > largest) largest = n;
        }
        result = Py_BuildValue("(nnnn)", (Py_ssize_t)s.nsamples, (Py_ssize_t)largest,
                               (Py_ssize_t)consumed, status);
    }
    PyMem_Free(s.samples);
    PyMem_Free(s.features);
    PyBuffer_Release(&buf);
    return result;
}

/* --- uncompressed TFRecord files: index by headers, read frames where they lie ----------- */

#define WINDOW 65536
#define SMALL_RECORD 4096

static int pread_full(int fd, uint8_t *p, size_t n, uint64_t offset) {
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (got == 0) return 0;
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return 1;
}

/* A cache of one window of the file, refilled only where small records make it pay off. */
typedef struct {
    int fd;
    uint64_t size, start, len;
    uint8_t buf[WINDOW];
} window_t;

static const uint8_t *header_at(window_t *w, uint64_t pos, int small) {
    if (pos >= w->start && pos + HEADER <= w->start + w->len) return w->buf + (pos - w->start);
    uint64_t want = small ? WINDOW : HEADER;
    if (want > w->size - pos) want = w->size - pos;
    if (want < HEADER) return NULL;
    if (pread_full(w->fd, w->buf, want, pos) != 1) return NULL;
    w->start = pos;
    w->len = want;
    return w->buf;
}

static PyObject *index_file(PyObject *self, PyObject *args) {
    int fd;
    unsigned long long size;
    if (!need_crc() || !PyArg_ParseTuple(args, "iK", &fd, &size)) return NULL;
    window_t *w = PyMem_Malloc(sizeof(window_t));
    size_t cap = 1024, n = 0;
    uint64_t *offsets = PyMem_Malloc(cap * sizeof(uint64_t));
    if (w == NULL || offsets == NULL) goto nomem;
    w->fd = fd;
    w->size = size;
    w->start = w->len = 0;
    uint64_t pos = 0, last = 0;
    while (pos < size) {
        const uint8_t *h = header_at(w, pos, last < SMALL_RECORD);
        if (h == NULL) {
            if (!PyErr_Occurred()) framing_error(pos, "truncated record header");
            goto fail;
        }
        if (masked_crc(h, 8) != get_u32(h + 8)) {
            framing_error(pos, "length CRC mismatch (not a TFRecord, or corrupt)");
            goto fail;
        }
        last = get_u64(h);
        if (last > size || pos + OVERHEAD + last > size) {
            truncated_error(pos, last);
            goto fail;
        }
        if (n == cap) {
            cap *= 2;
            uint64_t *grown = PyMem_Realloc(offsets, cap * sizeof(uint64_t));
            if (grown == NULL) goto nomem;
            offsets = grown;
        }
        offsets[n++] = pos;
        pos += OVERHEAD + last;
    }
    PyMem_Free(w);
    PyObject *out = PyBytes_FromStringAndSize((const char *)offsets, (Py_ssize_t)(n * 8));
    PyMem_Free(offsets);
    return out;
nomem:
    PyErr_NoMemory();
fail:
    PyMem_Free(w);
    PyMem_Free(offsets);
    return NULL;
}

static PyObject *read_frames(PyObject *self, PyObject *args) {
    int fd;
    unsigned long long size;
    Py_buffer offs, order;
    Py_ssize_t start, max_bytes;
    if (!need_crc() || !PyArg_ParseTuple(args, "iKy*y*nn", &fd, &size, &offs, &order, &start,
                                         &max_bytes))
        return NULL;
    const uint64_t *o = offs.buf;
    const uint32_t *ord = order.buf;
    Py_ssize_t n = offs.len / 8, count = order.len / 4, stop = start, total = 0;
    PyObject *data = NULL, *ends = NULL, *result = NULL;
    if (start < 0 || start > count) {
        PyErr_SetString(PyExc_IndexError, "read_frames(): start out of range");
        goto done;
    }
    while (stop < count && (stop == start || total < max_bytes)) { /* pass 1: which frames */
        uint32_t i = ord[stop++];
        if (i >= (uint64_t)n || o[i] > size || (i + 1 < (uint64_t)n && o[i + 1] < o[i])) {
            PyErr_SetString(PyExc_IndexError, "read_frames(): order names no frame");
            goto done;
        }
        uint64_t end = i + 1 < (uint64_t)n ? o[i + 1] : size;
        total += (Py_ssize_t)(end - o[i]);
    }
    if (!new_batch(total, stop - start, &data, &ends)) goto done;
    uint8_t *out = bytes_of(data), *base = out;
    uint64_t *e = ends_of(ends);
    for (Py_ssize_t k = start; k < stop; k++) {
        uint32_t i = ord[k];
        uint64_t end = i + 1 < (uint64_t)n ? o[i + 1] : size, len = end - o[i];
        int got = pread_full(fd, out, len, o[i]);
        if (got < 0) goto done;
        if (got == 0) {
            framing_error(o[i], "truncated record (the file shrank)");
            goto done;
        }
        /* Verified by the downloader; checked again because the data CRC is cheap (~0.05
         * CPU-s/GB) and a flipped bit in the cache must not reach a trainer unnoticed. */
        if (masked_crc(out + HEADER, len - OVERHEAD) != get_u32(out + len - 4)) {
            framing_error(o[i], "data CRC mismatch");
            goto done;
        }
        out += len;
        *e++ = (uint64_t)(out - base);
    }
    result = Py_BuildValue("(OOn)", data, ends, stop);
done:
    Py_XDECREF(data);
    Py_XDECREF(ends);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&order);
    return result;
}

/* --- checking a whole TFRecord file in file order (the downloader's verification) ------- */

#define CHECK_CHUNK (1024 * 1024)

typedef struct {
    int fd;
    uint64_t size, start, len; /* buf holds the file's bytes [start, start + len) */
    uint8_t *buf;
    int err; /* errno of a failed read, else 0 */
} reader_t;

/* CRC32C (unmasked, extended from `crc`) of the file's bytes [at, at + n), read through the
 * buffer; the bytes are copied to `out` too when it is not NULL. 0 if they are not all there. */
static int crc_range(reader_t *r, uint64_t at, uint64_t n, uint32_t *crc, uint8_t *out) {
    while (n > 0) {
        if (at < r->start || at >= r->start + r->len) {
            uint64_t want = r->size - at < CHECK_CHUNK ? r->size - at : CHECK_CHUNK;
            uint64_t got = 0;
            while (got < want) {
                ssize_t k = pread(r->fd, r->buf + got, want - got, (off_t)(at + got));
                if (k < 0 && errno == EINTR) continue;
                if (k < 0) {
                    r->err = errno;
                    return 0;
                }
                if (k == 0) break;
                got += (uint64_t)k;
            }
            r->start = at;
            r->len = got;
            if (got == 0) return 0;
        }
        uint64_t take = r->start + r->len - at;
        if (take > n) take = n;
        const uint8_t *p = r->buf + (at - r->start);
        if (crc != NULL) *crc = crc_extend(*crc, p, take);
        if (out != NULL) {
            memcpy(out, p, take);
            out += take;
        }
        at += take;
        n -= take;
    }
    return 1;
}

static uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + MASK_DELTA; }

/* Every frame of the file, in file order: the header's length CRC, that the data and footer
 * are there, the data CRC; the first fault found raises. Read in 1 MiB chunks, without the
 * GIL. */
static PyObject *check_file(PyObject *self, PyObject *args) {
    int fd;
    unsigned long long size;
    if (!need_crc() || !PyArg_ParseTuple(args, "iK", &fd, &size)) return NULL;
    reader_t r = {fd, size, 0, 0, PyMem_RawMalloc(CHECK_CHUNK), 0};
    if (r.buf == NULL) return PyErr_NoMemory();
    uint64_t pos = 0, length = 0;
    const char *fault = NULL; /* the first fault found, or */
    int truncated = 0;        /* the frame at pos ends past the file */
    Py_BEGIN_ALLOW_THREADS
    uint8_t h[HEADER], f[4];
    while (pos < size) {
        if (size - pos < HEADER || !crc_range(&r, pos, HEADER, NULL, h)) {
            fault = "truncated record header";
            break;
        }
        if (mask(crc_extend(0, h, 8)) != get_u32(h + 8)) {
            fault = "length CRC mismatch (not a TFRecord, or corrupt)";
            break;
        }
        length = get_u64(h);
        if (length > size || size - pos - OVERHEAD < length) {
            truncated = 1;
            break;
        }
        uint32_t crc = 0;
        if (!crc_range(&r, pos + HEADER, length, &crc, NULL) ||
            !crc_range(&r, pos + HEADER + length, 4, NULL, f)) {
            truncated = 1;
            break;
        }
        if (mask(crc) != get_u32(f)) {
            fault = "data CRC mismatch";
            break;
        }
        pos += OVERHEAD + length;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(r.buf);
    if (r.err) {
        errno = r.err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (truncated) return truncated_error(pos, length);
    if (fault != NULL) return framing_error(pos, fault);
    Py_RETURN_NONE;
}

/* --- reordering: take frames of several batches in a given order ------------------------ */

typedef struct {
    const uint8_t *p;
    uint64_t len;
} span_t;

/* One part: (data, ends, lo, hi); appends its frames lo..hi to `spans`. */
static int add_part(PyObject *part, span_t *spans, Py_ssize_t *n, Py_buffer *views) {
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(part, "y*y*nn", &views[0], &views[1], &lo, &hi)) return 0;
    const uint8_t *d = views[0].buf;
    const uint64_t *e = views[1].buf;
    if (lo < 0 || hi > views[1].len / 8 || lo > hi) {
        PyErr_SetString(PyExc_IndexError, "take(): part range out of bounds");
        return 0;
    }
    for (Py_ssize_t i = lo; i < hi; i++) {
        uint64_t s = i ? e[i - 1] : 0;
        spans[(*n)++] = (span_t){d + s, e[i] - s};
    }
    return 1;
}

static PyObject *take(PyObject *self, PyObject *args) {
    PyObject *parts, *result = NULL, *data = NULL, *ends = NULL;
    Py_buffer order;
    Py_ssize_t ostart, ostop;
    if (!PyArg_ParseTuple(args, "O!y*nn", &PyList_Type, &parts, &order, &ostart, &ostop))
        return NULL;
    Py_ssize_t nparts = PyList_GET_SIZE(parts), total = 0, n = 0;
    Py_buffer *views = PyMem_Calloc((size_t)nparts * 2 + 1, sizeof(Py_buffer));
    Py_ssize_t nspans = 0;
    for (Py_ssize_t k = 0; k < nparts; k++) {
        PyObject *t = PyList_GET_ITEM(parts, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
            PyErr_SetString(PyExc_TypeError, "take(): parts are (data, ends, lo, hi)");
            goto done;
        }
        nspans += PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3)) -
                  PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 2));
    }
    span_t *spans = PyMem_Malloc(sizeof(span_t) * (size_t)(nspans > 0 ? nspans : 1));
    if (views == NULL || spans == NULL || PyErr_Occurred()) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        PyMem_Free(spans);
        goto done;
    }
    for (Py_ssize_t k = 0; k < nparts; k++)
        if (!add_part(PyList_GET_ITEM(parts, k), spans, &n, &views[2 * k])) goto free_spans;
    const uint32_t *ord = order.buf;
    if (ostart < 0 || ostop > order.len / 4 || ostart > ostop) {
        PyErr_SetString(PyExc_IndexError, "take(): order range out of bounds");
        goto free_spans;
    }
    for (Py_ssize_t k = ostart; k < ostop; k++) {
        if (ord[k] >= (uint32_t)n) {
            PyErr_SetString(PyExc_IndexError, "take(): order names a frame out of range");
            goto free_spans;
        }
        total += (Py_ssize_t)spans[ord[k]].len;
    }
    if (new_batch(total, ostop - ostart, &data, &ends)) {
        uint8_t *out = bytes_of(data), *base = out;
        uint64_t *e = ends_of(ends);
        for (Py_ssize_t k = ostart; k < ostop; k++) {
            span_t s = spans[ord[k]];
            memcpy(out, s.p, s.len);
            out += s.len;
            *e++ = (uint64_t)(out - base);
        }
        result = Py_BuildValue("(NN)", data, ends);
    }
free_spans:
    for (Py_ssize_t k = 0; k < nparts * 2; k++)
        if (views[k].obj != NULL) PyBuffer_Release(&views[k]);
    PyMem_Free(spans);
done:
    PyMem_Free(views);
    PyBuffer_Release(&order);
    return result;
}

/* --- the writer's mix: frames of the open objects in the drawn order ---------------------- */

typedef struct {
    Py_buffer data, ends;
    Py_ssize_t count;
} source_t;

static PyObject *interleave(PyObject *self, PyObject *args) {
    PyObject *sources;
    Py_buffer cursors, picks;
    Py_ssize_t start, limit;
    if (!PyArg_ParseTuple(args, "O!w*y*nn", &PyList_Type, &sources, &cursors, &picks, &start,
                          &limit))
        return NULL;
    Py_ssize_t ns = PyList_GET_SIZE(sources), npicks = picks.len / 4;
    uint64_t *cur = cursors.buf;
    const uint32_t *pk = picks.buf;
    PyObject *result = NULL, *data = NULL;
    source_t *src = PyMem_Calloc((size_t)(ns ? ns : 1), sizeof(source_t));
    uint64_t *sim = PyMem_Calloc((size_t)(ns ? ns : 1), sizeof(uint64_t));
    Py_ssize_t opened = 0;
    if (src == NULL || sim == NULL || cursors.len / 8 < ns) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "interleave(): one cursor per source");
        goto done;
    }
    for (; opened < ns; opened++) {
        if (!PyArg_ParseTuple(PyList_GET_ITEM(sources, opened), "y*y*", &src[opened].data,
                              &src[opened].ends))
            goto done;
        src[opened].count = src[opened].ends.len / 8;
        sim[opened] = cur[opened];
    }
    Py_ssize_t stop = start, total = 0;
    while (stop < npicks && total < limit) { /* pass 1: how far, how many bytes */
        uint32_t s = pk[stop];
        if (s >= (uint32_t)ns) {
            PyErr_SetString(PyExc_IndexError, "interleave(): pick out of range");
            goto done;
        }
        if (sim[s] >= (uint64_t)src[s].count) break; /* the caller refills source s */
        const uint64_t *e = src[s].ends.buf;
        total += (Py_ssize_t)(e[sim[s]] - (sim[s] ? e[sim[s] - 1] : 0));
        sim[s]++;
        stop++;
    }
    data = PyBytes_FromStringAndSize(NULL, total);
    if (data == NULL) goto done;
    uint8_t *out = bytes_of(data);
    for (Py_ssize_t k = start; k < stop; k++) { /* pass 2: copy */
        uint32_t s = pk[k];
        const uint64_t *e = src[s].ends.buf;
        uint64_t from = cur[s] ? e[cur[s] - 1] : 0, len = e[cur[s]] - from;
        memcpy(out, (const uint8_t *)src[s].data.buf + from, len);
        out += len;
        cur[s]++;
    }
    result = Py_BuildValue("(On)", data, stop);
done:
    for (Py_ssize_t k = 0; k < opened; k++) {
        PyBuffer_Release(&src[k].data);
        PyBuffer_Release(&src[k].ends);
    }
    Py_XDECREF(data);
    PyMem_Free(src);
    PyMem_Free(sim);
    PyBuffer_Release(&cursors);
    PyBuffer_Release(&picks);
    return result;
}

/* --- seeded choices: SplitMix64, the same sequence as twin.SplitMix64 --------------------- */

static uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t below(uint64_t *state, uint32_t n) {
    return (uint32_t)(((unsigned __int128)splitmix(state) * n) >> 64);
}

static PyObject *permutation(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    unsigned long long state;
    if (!PyArg_ParseTuple(args, "nK", &n, &state)) return NULL;
    if (n < 0 || n > UINT32_MAX) return PyErr_Format(PyExc_ValueError, "n out of range");
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL) return NULL;
    uint32_t *p = (uint32_t *)PyBytes_AS_STRING(out);
    uint64_t s = state;
    for (Py_ssize_t i = 0; i < n; i++) p[i] = (uint32_t)i;
    for (Py_ssize_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        uint32_t j = below(&s, (uint32_t)(i + 1)), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return Py_BuildValue("(NK)", out, (unsigned long long)s);
}

static PyObject *picks(PyObject *self, PyObject *args) {
    Py_ssize_t n, k;
    unsigned long long state;
    if (!PyArg_ParseTuple(args, "nnK", &n, &k, &state)) return NULL;
    if (n < 1 || n > UINT32_MAX || k < 0) return PyErr_Format(PyExc_ValueError, "bad n or k");
    PyObject *out = PyBytes_FromStringAndSize(NULL, k * 4);
    if (out == NULL) return NULL;
    uint32_t *p = (uint32_t *)PyBytes_AS_STRING(out);
    uint64_t s = state;
    for (Py_ssize_t i = 0; i < k; i++) p[i] = below(&s, (uint32_t)n);
    return Py_BuildValue("(NK)", out, (unsigned long long)s);
}

/* Draws by group, then by slot: twin.source_picks (the writers' draw by source). */
static PyObject *source_picks(PyObject *self, PyObject *args) {
    Py_buffer groups, rates, credits;
    Py_ssize_t k;
    unsigned long long state;
    if (!PyArg_ParseTuple(args, "y*y*w*nK", &groups, &rates, &credits, &k, &state)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = groups.len / 4, ng = rates.len / 8;
    const uint32_t *slot = groups.buf;
    const uint64_t *rate = rates.buf;
    int64_t *credit = credits.buf;
    Py_ssize_t *count = PyMem_Calloc((size_t)(ng ? ng : 1), sizeof(Py_ssize_t));
    Py_ssize_t *first = PyMem_Calloc((size_t)(ng ? ng : 1), sizeof(Py_ssize_t));
    Py_ssize_t *present = PyMem_Calloc((size_t)(ng ? ng : 1), sizeof(Py_ssize_t));
    uint32_t *members = PyMem_Calloc((size_t)(n ? n : 1), sizeof(uint32_t));
    if (count == NULL || first == NULL || present == NULL || members == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n == 0 || k < 0 || credits.len / 8 != ng) {
        PyErr_SetString(PyExc_ValueError,
                        "source_picks(): no slots, or not one credit per rate");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (slot[i] >= (uint32_t)ng) {
            PyErr_SetString(PyExc_IndexError, "source_picks(): group out of range");
            goto done;
        }
        count[slot[i]]++;
    }
    Py_ssize_t np = 0, at = 0;
    uint64_t total = 0;
    for (Py_ssize_t g = 0; g < ng; g++) {
        first[g] = at;
        at += count[g];
        if (count[g]) {
            present[np++] = g;
            total += rate[g];
        }
        count[g] = 0; /* refilled below, as the members are placed */
    }
    for (Py_ssize_t i = 0; i < n; i++) members[first[slot[i]] + count[slot[i]]++] = (uint32_t)i;
    if (total == 0) {
        PyErr_SetString(PyExc_ValueError, "source_picks(): every present group has rate 0");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, k * 4);
    if (out == NULL) goto done;
    uint32_t *p = (uint32_t *)PyBytes_AS_STRING(out);
    uint64_t s = state;
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t best = present[0];
        for (Py_ssize_t j = 0; j < np; j++) {
            Py_ssize_t g = present[j];
            credit[g] += (int64_t)rate[g];
            if (credit[g] > credit[best]) best = g;
        }
        credit[best] -= (int64_t)total;
        p[i] = members[first[best] + below(&s, (uint32_t)count[best])];
    }
    out = Py_BuildValue("(NK)", out, (unsigned long long)s); /* N: the tuple owns the bytes */
done:
    PyMem_Free(count);
    PyMem_Free(first);
    PyMem_Free(present);
    PyMem_Free(members);
    PyBuffer_Release(&groups);
    PyBuffer_Release(&rates);
    PyBuffer_Release(&credits);
    return out;
}

/* --- set-up ------------------------------------------------------------------------------ */

static PyObject *set_crc32c(PyObject *self, PyObject *arg) {
    void *address = PyLong_AsVoidPtr(arg);
    if (address == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a NULL crc32c_extend");
        return NULL;
    }
    crc_extend = (crc_extend_fn)address;
    static const uint8_t check[] = "123456789"; /* the CRC-32C check value: 0xE3069283 */
    if (crc_extend(0, check, 9) != 0xE3069283u) {
        crc_extend = NULL;
        PyErr_SetString(PyExc_ValueError, "that function does not compute CRC-32C");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_masked_crc(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (!need_crc() || PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = masked_crc(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"set_crc32c", set_crc32c, METH_O, "Use the crc32c_extend at this address."},
    {"masked_crc", py_masked_crc, METH_O, "TensorFlow's masked CRC32C of a buffer."},
    {"frame_lines", frame_lines, METH_VARARGS, "Frame the lines of a chunk as Examples."},
    {"frame_records", frame_records, METH_O, "Frame a sequence of payloads."},
    {"frame_examples", frame_examples, METH_O, "Frame samples as Examples."},
    {"frame_file_example", frame_file_example, METH_VARARGS, "Frame a sample holding a file."},
    {"frame_tar", frame_tar, METH_VARARGS, "Frame the samples of a chunk of a tar stream."},
    {"check_tar", check_tar, METH_VARARGS, "Check the samples of a chunk of a tar stream."},
    {"index_file", index_file, METH_VARARGS, "Frame offsets of a TFRecord file."},
    {"read_frames", read_frames, METH_VARARGS, "Read frames in a given order."},
    {"check_file", check_file, METH_VARARGS, "Check every frame of a TFRecord file."},
    {"take", take, METH_VARARGS, "Frames of several batches in a given order."},
    {"interleave", interleave, METH_VARARGS, "Frames of several sources by picks."},
    {"permutation", permutation, METH_VARARGS, "A seeded permutation of range(n)."},
    {"picks", picks, METH_VARARGS, "k seeded draws from range(n)."},
    {"source_picks", source_picks, METH_VARARGS, "k seeded draws by group, then by slot."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "prefetchd.kernel._native",
    "The record kernel's per-record loops in C (see prefetchd/kernel/twin.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
