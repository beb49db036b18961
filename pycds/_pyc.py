"""The .pyc and source rules of plain import, as DUMP and SHARE apply them.

What plain import would do: the ``.pyc`` and source rules DUMP and SHARE
both apply.

``SourceLoader.get_code`` (importlib/_bootstrap_external.py, 3.10-3.13) runs a
module's ``.pyc`` when its header is valid for the source (a timestamp
``.pyc`` of the source's mtime in seconds and size; a hash-based one, PEP
552, of its hash where the policy checks it), and compiles the source
otherwise.  DUMP records which ``.pyc`` it saw (:func:`pyc_facts`); SHARE
serves archived code only where plain import would run that very code now
(:func:`check`).  Imported at start-up by SHARE runs: builtins and
importlib only.
"""

import _frozen_importlib_external as _bootstrap_external
import _imp
import _io
import os

from _frozen_importlib_external import _RAW_MAGIC_NUMBER

from ._config import loader_patched
from ._format import PYC_CHECKED_HASH, PYC_NONE, PYC_TIMESTAMP, PYC_UNCHECKED_HASH
from .errors import program_raised

__all__ = ["check", "stale", "classify_pyc", "pyc_facts", "source_hash",
           "stat_or_none", "file_facts", "loader_patched"]

# What plain import does with a .pyc for its source (classify_pyc).
PYC_VALID, PYC_UNCHECKED, PYC_INVALID = range(3)

# Bound at import, as importlib binds posix.stat: a program that replaces
# os.stat (mock.patch) changes neither what plain import sees nor this.
_stat = os.stat


def stat_or_none(path):
    """Return os.stat(path), or None where it fails.

    ``os.stat(path)`` (as bound at import), or None where it fails; what
    the program raised meanwhile (:func:`pycds.errors.program_raised`)
    propagates."""
    try:
        return _stat(path)
    except (OSError, ValueError) as e:
        if program_raised(e):
            raise
        return None


def cache_path(origin):
    """Return the .pyc path plain import would read for origin, or None.

    The ``.pyc`` path plain import would read for ``origin`` in this
    process (``sys.pycache_prefix``, ``-O``), as SHARE is given it by the
    spec; None where there is none."""
    try:
        return _bootstrap_external.cache_from_source(origin)
    except (NotImplementedError, ValueError):
        return None


def file_facts(path):
    """Return (st_mtime_ns, st_size, st_mtime) of path, or None.

    ``(st_mtime_ns, st_size, st_mtime)`` of ``path``
    (:func:`stat_or_none`), or None: what :func:`check` judges a source or
    ``.pyc`` by.  The native hit path (native/archive/loader/find.c) hands
    the same tuples to :func:`check`."""
    st = stat_or_none(path)
    return None if st is None else (st.st_mtime_ns, st.st_size, st.st_mtime)


def source_hash(data):
    """The PEP 552 source hash of ``data`` (as importlib.util.source_hash)."""
    return _imp.source_hash(_RAW_MAGIC_NUMBER, data)


def read_code_file(path, size=-1):
    """Return the first size bytes of path as plain import reads them, or None.

    The first ``size`` bytes (all: -1) of the source or ``.pyc`` at
    ``path`` as plain import reads them (FileLoader.get_data, 3.10-3.13):
    through the interpreter's open-code hook, which an embedder may set to
    vet code files (PyFile_SetOpenCodeHook, PEP 578); None if it cannot be
    read."""
    try:
        with _io.open_code(path) as f:
            return f.read(size)
    except OSError as e:
        if program_raised(e):
            raise
        return None


def source_hash_of(path):
    """Return the source hash of the file at path, or None.

    The source hash of the file at ``path`` (:func:`read_code_file`), or
    None if it cannot be read."""
    data = read_code_file(path)
    return None if data is None else source_hash(data)


def pyc_source_checked(checked):
    """Return whether plain import checks a hash-based .pyc's source hash.

    Whether plain import compares the source's hash with a hash-based
    .pyc's, given the .pyc's check_source flag ``checked``: checked pycs
    under ``_imp.check_hash_based_pycs`` "default", every one under
    "always", none under "never"."""
    policy = _imp.check_hash_based_pycs
    return policy == "always" or (policy == "default" and bool(checked))


def classify_pyc(head, st, src_hash):
    """Return PYC_VALID, PYC_UNCHECKED or PYC_INVALID for a .pyc's header.

    What plain import does with the ``.pyc`` whose first 16 bytes are
    ``head`` (None: no .pyc, or unreadable) for the source of stat ``st``
    and hash ``src_hash`` (:func:`source_hash`; None where not known), as
    ``_classify_pyc``, ``_validate_timestamp_pyc`` and
    ``_validate_hash_pyc`` decide: :data:`PYC_VALID` it runs the .pyc;
    :data:`PYC_UNCHECKED` it runs a hash-based .pyc it does not check
    against the source; :data:`PYC_INVALID` it compiles the source (a
    checked hash-based .pyc with ``src_hash`` None is taken for one)."""
    return _classify(head, st.st_mtime, st.st_size, src_hash)


def _classify(head, mtime, size, src_hash):
    # classify_pyc, for a source of st_mtime ``mtime`` and st_size ``size``.
    if head is None or len(head) < 16 or head[:4] != _bootstrap_external.MAGIC_NUMBER:
        return PYC_INVALID
    flags = int.from_bytes(head[4:8], "little")
    if flags & ~0b11:
        return PYC_INVALID
    if flags & 0b1:
        if not pyc_source_checked(flags & 0b10):
            return PYC_UNCHECKED
        return PYC_VALID if src_hash is not None and head[8:16] == src_hash else PYC_INVALID
    if (int.from_bytes(head[8:12], "little") != int(mtime) & 0xFFFFFFFF
            or int.from_bytes(head[12:16], "little") != size & 0xFFFFFFFF):
        return PYC_INVALID
    return PYC_VALID


def pyc_facts(cached):
    """Return (kind, stat or None, first 16 bytes) of the .pyc at cached.

    ``(kind, os.stat_result or None, first 16 bytes)`` of the .pyc at
    ``cached`` (the spec's), as a DUMP run records them: kind is one of
    :data:`PYC_NONE`, :data:`PYC_TIMESTAMP`, :data:`PYC_CHECKED_HASH`,
    :data:`PYC_UNCHECKED_HASH`."""
    if not cached:
        return PYC_NONE, None, b""
    try:
        with open(cached, "rb") as f:
            head = f.read(16)
            st = os.fstat(f.fileno())
    except OSError:
        return PYC_NONE, None, b""
    if len(head) < 16:
        return PYC_NONE, None, b""
    flags = int.from_bytes(head[4:8], "little")
    if flags & 1:
        kind = PYC_CHECKED_HASH if flags & 2 else PYC_UNCHECKED_HASH
    else:
        kind = PYC_TIMESTAMP
    return kind, st, head


def stale(entry, mode, cached=None):
    """Return why plain import would not run entry's archived code, or None.

    Why plain import would not run ``entry``'s archived code now, or None
    (:func:`check`; ``python -m pycds verify``)."""
    return check(entry, mode, cached)[0]


def check(entry, mode, cached=None, facts=None):
    """Return (reason or None, source facts) for entry's archived code.

    ``(reason, st)``: why plain import would not run the archived code of
    ``entry`` (a :class:`pycds._archive.ModuleEntry`) now, None where it
    would, and the source's :func:`file_facts` (None where not taken).
    ``mode``: the PYCDSCHECK value (``"mtime"``, ``"hash"``,
    ``"unchecked"``).  ``cached``: the ``.pyc`` path plain import would read
    now (the spec's), if known.  ``facts``: the :func:`file_facts` of
    ``entry.origin`` and of ``entry.pyc_path`` (None where that is empty),
    taken a moment ago by the native hit path; None: take them now."""
    if mode == "unchecked":
        return None, None
    if facts is None:
        st = file_facts(entry.origin)
        pst = _MISSING
    else:
        st, pst = facts
    if st is None:
        return "source is gone", None
    if st[1] != entry.size:
        return "source changed", st
    if entry.pyc_kind in (PYC_CHECKED_HASH, PYC_UNCHECKED_HASH) and \
            (cached is None or cached == entry.pyc_path):
        if pst is _MISSING:
            pst = file_facts(entry.pyc_path)
        reason, src_hash, mode = _check_hash_pyc(entry, st, pst, mode)
    else:
        reason, src_hash, mode = _check_timestamp_pyc(entry, st, pst, mode, cached)
    if reason is None and mode == "hash":
        if src_hash is None:
            src_hash = source_hash_of(entry.origin)
            if src_hash is None:
                return "source is unreadable", st
        if src_hash != entry.source_hash:
            return "source hash differs", st
    return reason, st


# (check: the .pyc's facts are not taken yet.)
_MISSING = object()


def _check_hash_pyc(entry, st, pst, mode):
    # The dump ran a hash-based .pyc: plain import trusts (or checks) it, so
    # it must be the same file, under the same policy, as at the dump.
    # st, pst: the file_facts of the source and the .pyc.  Returns (reason,
    # source hash or None, check mode from now on).
    if st[0] != entry.mtime_ns:
        return "source changed", None, mode
    if _imp.check_hash_based_pycs != entry.check_hash_pycs:
        return "check_hash_based_pycs differs", None, mode
    if pst is None:
        return "hash-based .pyc is gone", None, mode
    if not _as_dumped(pst, entry):
        return "hash-based .pyc changed", None, mode
    # Where plain import compares the source hash with the .pyc's, an edit
    # that keeps mtime and size is seen by plain import; so it must be here.
    if pyc_source_checked(entry.pyc_kind == PYC_CHECKED_HASH):
        mode = "hash"
    return None, None, mode


def _check_timestamp_pyc(entry, st, pst, mode, cached):
    # Plain import runs a timestamp .pyc whose header matches the source's
    # mtime (seconds) and size, else compiles the source.  While the .pyc is
    # the very file the dump left and the source's stat is the dumped one,
    # the archived code is its code.  Otherwise (a .pyc written again or
    # removed, another .pyc path, a source touched since) the archived code
    # is plain import's only if the source is the dumped one byte for byte,
    # which a stat cannot tell.  (Limits: docs/importer-compliance.md.)
    # st: the source's file_facts; pst: entry.pyc_path's, or _MISSING.
    # Returns (reason, source hash or None, check mode from now on).
    other_pyc = cached is not None and cached != entry.pyc_path
    pyc = entry.pyc_path if cached is None else cached
    if pst is _MISSING or other_pyc:
        pst = file_facts(pyc) if pyc else None
    dumped = (entry.pyc_kind == PYC_TIMESTAMP and not other_pyc
              and _as_dumped(pst, entry))
    moved = st[0] != entry.mtime_ns
    if not moved and dumped:
        return None, None, mode
    src_hash = None
    if not dumped:
        # (Not for the dumped .pyc: plain import reads no source to take it,
        # nor need this; an audit hook sees no extra open.)
        src_hash = source_hash_of(entry.origin)
        if src_hash is None:
            return "source is unreadable", None, mode
    head = read_code_file(pyc, 16) if pst is not None else None
    use = _classify(head, st[2], st[1], src_hash)
    if use == PYC_UNCHECKED:
        return "an unchecked hash-based .pyc replaced the dumped one", src_hash, mode
    if use != PYC_VALID or not dumped:
        # (The dumped .pyc still valid for a source touched within the
        # second is what plain import runs: the archived code.)
        mode = "hash"
    return None, src_hash, mode


def _as_dumped(pst, entry):
    """Return whether pst is that of the .pyc the dump left for entry.

    Whether ``pst`` (a ``.pyc``'s :func:`file_facts`, or None) is that of
    the ``.pyc`` the dump run left for ``entry``."""
    return (pst is not None and pst[0] == entry.pyc_mtime_ns
            and pst[1] == entry.pyc_size)
