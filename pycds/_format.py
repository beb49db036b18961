"""The archive format's constants: the one specification both sides read.

Python reads this module (pycds._archive, pycds._pyc); the native build
reads it as text (native/archive/build.py parses its literal assignments
and writes them into the C header ``pycds_format.h``), so the C loader has
no number of its own to keep in step.  tests/native/test_format.py fails
when the module built differs from this file.  Literals only, no imports:
the build reads it without importing pycds.  Byte by byte in
docs/archive-format.md.  Sections, in file order::

    header | meta | bucket table | module entries | chunk table | heap | relocations
"""

MAGIC = b"PYCDS\x00ar"
FORMAT_VERSION = 6
HEADER_SIZE = 256

# Header fields: (name, offset, size in bytes), little-endian.  Bytes
# 148..151 and 168..247 are reserved (zero).
HEADER_FIELDS = (
    ("magic", 0, 8),
    ("format", 8, 4),
    ("header_size", 12, 4),
    ("archive_id", 16, 8),
    ("created_ns", 24, 8),
    ("nmodules", 32, 4),
    ("flags", 36, 4),
    ("meta_off", 40, 8),
    ("meta_len", 48, 8),
    ("buckets_off", 56, 8),
    ("nbuckets", 64, 8),
    ("entries_off", 72, 8),
    ("entries_len", 80, 8),
    ("heap_off", 88, 8),
    ("heap_len", 96, 8),
    ("reloc_off", 104, 8),
    ("reloc_count", 112, 8),
    ("file_len", 120, 8),
    ("meta_sum", 128, 8),
    ("buckets_sum", 136, 8),
    ("py_hexversion", 144, 4),
    ("chunks_off", 152, 8),
    ("chunks_sum", 160, 8),
)
# The header's own checksum: SipHash of bytes [0, HEADER_SUM_AT) keyed
# with HEADER_KEY, stored at HEADER_SUM_AT (8 bytes).
HEADER_SUM_AT = 248
HEADER_KEY = 0x50594344534844        # "PYCDSHD"

# Bucket table: nbuckets 8-byte buckets (name hash >> 32, u32; entry
# offset, u32; EMPTY_BUCKET where none), probed linearly from
# name_hash & (nbuckets - 1); names hashed with SipHash keyed NAME_KEY.
BUCKET_SIZE = 8
EMPTY_BUCKET = 0xFFFFFFFF
NAME_KEY = 0x50594344534E4D          # "PYCDSNM"

# Module entries: length (u32, the record's bytes), checksum (u64, SipHash
# of the payload keyed with the archive id), then the payload: a marshalled
# tuple of these fields, in this order.
ENTRY_HEAD = 12
ENTRY_FIELDS = (
    "number", "name", "origin", "is_package", "search_locations",
    "mtime_ns", "size", "source_hash", "pyc_path", "pyc_kind",
    "pyc_mtime_ns", "pyc_size", "check_hash_pycs",
    "chunk_off", "chunk_len", "root_off", "reloc_first",
    "reloc_count", "chunk_sum", "nobjects", "search",
)
# Bytes read at once for an entry (most are a few hundred); a longer one
# takes a second read.
ENTRY_READ = 1024

# How a module's code reached the dump run: an entry's pyc_kind.
PYC_NONE = 0
PYC_TIMESTAMP = 1
PYC_CHECKED_HASH = 2
PYC_UNCHECKED_HASH = 3

# Chunk table: one record per module, in module-number order, in the
# writing machine's byte order (the loader reads records as structs; an
# archive is only read by the interpreter build that wrote it): (name,
# offset, size in bytes).
CHUNK_FIELDS = (
    ("chunk_off", 0, 8),
    ("chunk_len", 8, 4),
    ("root_off", 12, 4),
    ("reloc_first", 16, 8),
    ("reloc_count", 24, 4),
    ("zero", 28, 4),
    ("checksum", 32, 8),
)
CHUNK_REC = 40

# The heap section's alignment in the file: the format's, not the page
# size (the loader reads the heap into memory of its own), so an archive
# written under 4 KiB pages is served under 16 or 64 KiB ones.
HEAP_ALIGN = 4096
# Relocation entries: u32 each, native order.
RELOC_SIZE = 4
