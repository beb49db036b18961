"""DUMP: write the code of the modules a program imported to an archive.

DUMP: collect the code objects of the modules a program imported and write
them to an archive.

What is archived: every module in ``sys.modules`` whose spec names it and
whose loader is the stock :class:`importlib.machinery.SourceFileLoader` (the
path importer's loader for ``.py`` files) -- stdlib and site-packages
included.  Builtin, frozen, extension and namespace modules, ``__main__``, and
modules with other loaders are left to plain import.

The code object archived is the one plain import would run now: the one
this run's import executed (pycds.dumping.capture), when neither the source nor
the ``.pyc`` plain import trusts for it changed since, else
``loader.get_code(name)`` again (from the ``.pyc`` when it is valid, else
compiled from source).  Modules imported at start-up before ``pycds.pth``
ran are not archived by a DUMP run (a SHARE run imports them before its
finder exists).  Either way the archive holds its fresh
form: bytecode as unmarshal makes it, whatever running it specialised
(native/archive/common/layout).  With it goes what the share run needs to prove that plain
import would still produce the same code: the source's ``st_mtime_ns`` and
size and a source hash, and the ``.pyc``'s kind and stat when it was
hash-based (PEP 552).
"""

import _imp
import gc
import marshal
import os
import sys
import time
# importlib.machinery re-exports these; importing it would also import
# importlib and warnings at every DUMP start-up.
from _frozen_importlib import ModuleSpec
from _frozen_importlib_external import SourceFileLoader

from .. import _archive, _config, _files, _log, _pyc, _search
from .._config import import_native, is_hook_module
from . import capture as _capture, order as _dump_order
from ..errors import ArchiveFormatError, NativeError

__all__ = ["snapshot", "dump_modules", "dump_at_exit", "write_archive"]



def snapshot():
    """The ``(name, module)`` pairs of ``sys.modules`` now."""
    # (A key that is not a str -- a program may put anything there -- names
    # no importable module: left out here, so that collect() and spec_of()
    # see str names only.)
    return [(name, m) for name, m in list(sys.modules.items()) if type(name) is str]


# The namespace of a module, read without running the module's class: a
# lazily loaded module (importlib.util.LazyLoader) runs its body on the first
# attribute it is asked for, and a dump at exit must not run it.
_ModuleType = type(sys)       # types.ModuleType, without importing types
_MODULE_DICT = _ModuleType.__dict__["__dict__"]


def spec_of(name, module):
    if not issubclass(type(module), _ModuleType):
        return None
    try:
        spec = _MODULE_DICT.__get__(module).get("__spec__")
    except Exception:
        return None
    if not issubclass(type(spec), ModuleSpec) or spec.name != name:
        return None
    return spec


def _code_that_ran(name, module, spec, st, src_hash, pyc_st, pyc_head):
    """Return the code module's import ran, if plain import would run it now.

    The module code the import of ``module`` ran (pycds.dumping.capture), if it
    is the code plain import would run now; else None.  ``st`` and
    ``src_hash``: the source's stat and hash (pycds._pyc.source_hash) now; ``pyc_st`` and ``pyc_head``: the stat
    and first 16 bytes of its .pyc (None, b"" without one)."""
    if getattr(spec, "_initializing", None) is not False:
        return None         # not loaded by importlib's _load_unlocked
    ran = _capture.ran(name, module, spec.origin, st)
    if ran is None:
        return None
    code, when = ran
    # The .pyc plain import would load now, unchanged since before the
    # import: the code that ran came from it.
    if pyc_st is None or pyc_st.st_ctime_ns >= when - _capture.SETTLED_NS \
            or _pyc.classify_pyc(pyc_head, st, src_hash) == _pyc.PYC_INVALID:
        return None
    return code


def collect(pairs):
    """Yield (name, module, spec) for the archivable modules among pairs.

    Yield ``(name, module, spec)`` for the archivable modules among
    ``pairs`` (from :func:`snapshot`: str names)."""
    seen = set()
    for name, module in pairs:
        if name == "__main__" or name in seen or is_hook_module(name):
            continue
        spec = spec_of(name, module)
        # (Modules a SHARE run served have the stock loader too: pycds.share.)
        if spec is None or type(spec.loader) is not SourceFileLoader:
            continue
        if not spec.has_location or not spec.origin:
            continue
        seen.add(name)
        yield name, module, spec


def dump_modules(pairs, path, verbose=0, session=None, skip_preloaded=False,
                 refresh=None, roots=None):
    """Archive the modules among pairs into path; return the counts.

    Archive the modules among ``pairs`` into ``path``; with
    ``skip_preloaded``, not those imported before capturing started
    (pycds.dumping.capture.preloaded).

    Returns ``(archived, skipped)`` counts.  Raises OSError when the file
    cannot be written or ``path`` holds a file that is not a pycds archive
    (pycds._files.check_replaceable: left as it is) and ImportError when the native module is missing;
    modules that cannot be archived are skipped (listed at PYCDSVERBOSE=2).
    With a ``session`` id (see :func:`pycds._config.dump_session`), modules that other
    processes of the session wrote to ``path`` are kept.

    ``refresh`` (AUTO: pycds.auto) is a function of the archive now at
    ``path`` that gives the pairs still to write into it and the meta
    entries to add, or None when it needs nothing; the modules of that
    archive not among them are kept, whatever session wrote them.  It runs
    under the directory lock, so that processes writing at once each see
    what the others wrote.

    ``roots``: the module names the layout starts from, in order
    (pycds.dumping.order); None: those the program's own code imports.
    """
    from .. import _nativewriter as N

    # (Before the copying: a path that holds a file of the user's costs nothing.)
    _files.check_replaceable(path, _archive.ARCHIVE_FILE)
    if refresh is None:
        copied = _copy(pairs, verbose, skip_preloaded, roots, N)
        with _files.directory_lock(path):
            if session and not _session_is_ours(session) and _session_of(path) == session:
                # The session's archive, of another interpreter: keep it whole.
                if verbose:
                    _log.verbose(f"no archive written by this process: its interpreter is "
                                 f"not the one its DUMP session began with ({path})", 1)
                return 0, copied[2]
            # Processes of one DUMP session (a program and the children that
            # inherit PYCDSMODE=DUMP) each write the archive at exit; each keeps
            # the modules the others wrote, so the last writer loses nothing.
            n = _write(path, copied, session, session, N)
    else:
        with _files.directory_lock(path):
            plan = refresh(path)
            if plan is None:
                return 0, 0
            pairs, extra_meta = plan
            copied = _copy(pairs, verbose, False, roots, N)
            copied[3].update(extra_meta)
            n = _write(path, copied, None, True, N)
    _warn_if_refused(path)
    return n, copied[2]


def _copy(pairs, verbose, skip_preloaded, roots, N):
    """Return (writer, entries, skipped, meta) for the modules among pairs.

    ``(writer, entries, skipped, meta)``: the archivable modules among
    ``pairs`` copied into a new native writer, and the archive's meta."""
    # A function object in a reference cycle keeps its code object until the
    # collector runs; what the writer predicts dead (a code object only its
    # module's constants hold) must not depend on when it last ran.
    gc.collect()
    writer = N.Writer(_PROVISIONAL_ID)
    entries, skipped, ranges = _add_modules(writer, pairs, verbose, skip_preloaded, roots)
    meta = _archive.meta_for_this_interpreter()
    if ranges is not None:
        # What the code is, whatever the environment says by now.
        meta["debug_ranges"] = ranges
    meta["layout"] = N.layout_id()
    counter = N.version_counter_at()
    if counter is not None:
        meta["version_counter"] = counter
    meta["pycds"] = _pycds_version()
    # Which program it is for (python -m pycds info, cache list).
    meta["program"] = list(getattr(sys, "orig_argv", sys.argv))
    meta["executable"] = sys.executable
    return writer, entries, skipped, meta


# The writer's checksum seed; the archive's id, which keys its checksums, is
# derived from its content once it is complete (_content_id).
_PROVISIONAL_ID = 1


def _write(path, copied, session, carry, N):
    """Write copied to path, with old modules it lacks; return the count.

    Write ``copied`` (from :func:`_copy`) to ``path``, with the modules
    of the archive there that it lacks when ``carry`` is true (``True``:
    whatever session wrote them; a session id: only that session's).
    Returns the number of modules written.  Call with the directory lock
    held."""
    writer, entries, _, meta = copied
    heap = writer.heap()
    relocs = writer.relocs()
    more = _carry_over(path, carry, entries, _PROVISIONAL_ID, len(heap),
                       len(relocs) // 4, writer.nstrings(), N) if carry else ([], [], [])
    if more[0]:
        entries = entries + more[0]
        heap = b"".join([heap, *more[1]])
        relocs = b"".join([relocs, *more[2]])
    # The session is a fact of the process tree, not of the files: an
    # extended attribute, so that the bytes stay reproducible; in the meta
    # only where the file system takes no such attribute.
    xattrs = {SESSION_XATTR: session.encode()} if session else None
    while True:
        archive_id = _content_id(entries, heap, relocs, meta, N)
        _sign(entries, heap, relocs, archive_id, N)
        header, parts = _archive.file_sections(entries, len(heap), len(relocs) // 4,
                                        meta, archive_id)
        parts.insert(0, (0, header.pack()))
        parts.append((header.heap_off, heap))
        parts.append((header.reloc_off, relocs))
        if _files.write_atomic(path, parts, _archive.ARCHIVE_FILE, header.file_len, xattrs) \
                or not xattrs:
            return len(entries)
        meta["session"] = session
        xattrs = None


def _content_id(entries, heap, relocs, meta, N):
    """Return the archive's id, an XXH64 of its content.

    The archive's id: XXH64 of everything its checksums cover but the
    checksums themselves, so that the same content gets the same id
    (reproducible bytes) and two archives that differ anywhere do not."""
    facts = repr((sorted(meta.items()),
                  [e.to_tuple()[:-3] + e.to_tuple()[-2:] for e in entries]))
    seed = N.hash64(facts.encode("utf-8", "surrogatepass"))
    return N.hash64(relocs, N.hash64(heap, seed)) or 1


def _sign(entries, heap, relocs, archive_id, N):
    """Set each entry's chunk_sum for archive_id.

    Set each entry's ``chunk_sum`` for ``archive_id`` (the chain the
    native loader checks: its chunk, then its relocation entries)."""
    heap, relocs = memoryview(heap), memoryview(relocs).cast("B")
    for e in entries:
        chunk = heap[e.chunk_off:e.chunk_off + e.chunk_len]
        rel = relocs[4 * e.reloc_first:4 * (e.reloc_first + e.reloc_count)]
        e.chunk_sum = N.hash64(rel, N.hash64(chunk, archive_id))


def _add_modules(writer, pairs, verbose, skip_preloaded, roots):
    """Copy archivable modules into writer; return (entries, skipped, ranges).

    Copy the code of the archivable modules among ``pairs`` into
    ``writer``.  Returns ``(entries, skipped, ranges)``: their index
    entries, the count of modules that could not be archived, and whether
    the archived code has column positions (None: no module)."""
    entries = []
    skipped = 0
    searches = _search.Recorder()
    as_ran = 0
    ranges = None
    read = {}
    for name, module, spec in collect(pairs):
        if skip_preloaded and _capture.preloaded(name, module):
            continue
        try:
            read[name] = _read_module(name, module, spec)
        except Exception as e:
            skipped += 1
            if verbose >= 2:
                _log.verbose(f"not archived {name}: {e}", 2)
    names = _dump_order.order({name: (r[0], r[1].parent) for name, r in read.items()},
                              _dump_order.program_imports() if roots is None else roots)
    for name in names:
        code, spec, ran, entry = read.pop(name)
        try:
            _copy_module(writer, len(entries), code, ran, spec, entry)
        except Exception as e:
            skipped += 1
            if verbose >= 2:
                _log.verbose(f"not archived {name}: {e}", 2)
            continue
        entry.search = searches.record(name, spec)
        entries.append(entry)
        if ranges is None:
            ranges = _archive.code_debug_ranges(code)
        if ran[0]:
            as_ran += 1
        elif verbose >= 2:
            _log.verbose(f"read again {name}", 2)
    if verbose >= 2:
        _log.verbose(f"{as_ran} of {len(entries)} modules archived as their "
                     f"import ran them, {len(entries) - as_ran} read again", 2)
    return entries, skipped, ranges


def _read_module(name, module, spec):
    """Return (code, spec, ran, entry) for module; raise if unarchivable.

    The code plain import would run now for ``module``: ``(code, spec,
    ran, entry)``, with whether that is the code the import ran and its
    index entry (without its chunk, for :func:`_copy_module`, and without
    its search record).  Raises where the module cannot be archived."""
    origin = spec.origin
    st = os.stat(origin)
    with open(origin, "rb") as f:
        src_hash = _pyc.source_hash(f.read())
    pyc_kind, pyc_st, pyc_head = _pyc.pyc_facts(spec.cached)
    ran = _code_that_ran(name, module, spec, st, src_hash, pyc_st, pyc_head)
    if ran is None and _pyc.loader_patched():
        # What the stock loader would make cannot be had now.
        raise ImportError("SourceFileLoader is patched: not read again")
    if ran is None:
        code = SourceFileLoader(name, origin).get_code(name)
        # It may have written the .pyc a later plain import reads.
        pyc_kind, pyc_st, pyc_head = _pyc.pyc_facts(spec.cached)
    else:
        code = ran
    if (pyc_kind == _pyc.PYC_TIMESTAMP
            and _pyc.classify_pyc(pyc_head, st, src_hash) == _pyc.PYC_INVALID):
        # Plain import compiles the source past this .pyc: a SHARE run
        # checks the source's bytes (pycds._pyc.check).  (A hash-based .pyc
        # stays recorded: whether plain import checks it depends on the
        # policy of the SHARE run.)
        pyc_kind, pyc_st = _pyc.PYC_NONE, None
    st2 = os.stat(origin)
    if (st.st_mtime_ns, st.st_size) != (st2.st_mtime_ns, st2.st_size):
        raise OSError("source changed during the dump")
    orders = _frozenset_orders(code, spec.cached, pyc_head) if ran is not None else None
    locations = spec.submodule_search_locations
    entry = _archive.ModuleEntry(
        0, name, origin, locations is not None,
        tuple(locations) if locations is not None else None,
        st.st_mtime_ns, st.st_size, src_hash,
        spec.cached, pyc_kind,
        pyc_st.st_mtime_ns if pyc_st is not None else 0,
        pyc_st.st_size if pyc_st is not None else 0,
        _imp.check_hash_based_pycs,
        0, 0, 0, 0, 0, 0, 0, None)
    return code, spec, (ran is not None, orders), entry


def _copy_module(writer, number, code, ran, spec, entry):
    """Copy code into writer as module number, filling entry's chunk fields.

    Copy ``code`` (of :func:`_read_module`, with ``ran``) into
    ``writer`` as module ``number``, filling ``entry``'s chunk fields.
    Raises where it cannot be copied (the writer is left as before)."""
    ran, orders = ran
    chunk = writer.add(code, ran=ran, orders=orders)
    entry.number = number
    entry.chunk_off, entry.chunk_len, entry.root_off = \
        chunk.chunk_off, chunk.chunk_len, chunk.root_off
    entry.reloc_first, entry.reloc_count, entry.chunk_sum = \
        chunk.reloc_first, chunk.reloc_count, chunk.checksum
    entry.nobjects = chunk.nobjects


def _frozenset_orders(code, pyc_path, pyc_head):
    """Return the unmarshal order of code's frozenset items, or None.

    For :meth:`pycds._nativewriter.Writer.add`: the order unmarshal adds the
    items of each frozenset constant of ``code`` (the code an import ran
    from the .pyc at ``pyc_path``, whose first 16 bytes are ``pyc_head``),
    read off a fresh unmarshal of that .pyc.  The program may have bound an
    item elsewhere since (a loop variable left at module level), which
    changes what the writer would infer from reference counts, and by how
    the hash seed ordered the loop: not reproducible.  None when ``code``
    has no frozenset or the .pyc cannot be read as it was."""
    if not _has_frozenset(code):
        return None
    try:
        with open(pyc_path, "rb") as f:
            data = f.read()
        if data[:16] != pyc_head:
            return None
        fresh = marshal.loads(memoryview(data)[16:])
    except (OSError, ValueError, EOFError, TypeError):
        return None
    orders = {}
    _pair_frozensets(code, fresh, orders)
    return orders


def _has_frozenset(code):
    for const in code.co_consts:
        t = type(const)
        if t is frozenset or (t is type(code) and _has_frozenset(const)) or \
                (t is tuple and any(type(x) in (frozenset, tuple) for x in const)):
            return True
    return False


def _pair_frozensets(ran, fresh, orders, depth=0):
    """Fill orders for ran's frozensets from those of fresh.

    Fill ``orders`` for the frozensets of ``ran`` from those at the same
    places in ``fresh``, an equal constant (code, tuple, frozenset)."""
    if type(ran) is not type(fresh) or depth > 100:
        return
    if type(ran) is frozenset:
        if len(ran) == len(fresh):
            same = {item: item for item in ran}
            try:
                from .. import _nativewriter as N
                orders[id(ran)] = tuple(same[item] for item in N.frozenset_items(fresh))
            except (KeyError, NativeError):
                pass
        return
    if type(ran) is tuple:
        pairs = zip(ran, fresh) if len(ran) == len(fresh) else ()
    elif hasattr(ran, "co_consts") and len(ran.co_consts) == len(fresh.co_consts):
        pairs = zip(ran.co_consts, fresh.co_consts)
    else:
        return
    for a, b in pairs:
        if type(a) in (frozenset, tuple) or hasattr(a, "co_consts"):
            _pair_frozensets(a, b, orders, depth + 1)


def _warn_if_refused(path):
    """Warn if a SHARE run would refuse the archive just written at path.

    One warning now, when a SHARE run would refuse the archive just
    written at ``path`` for where it lies (a directory others may write) or
    its mode (``pycds._nativeapi.check_trusted``): better than a refusal in
    every run after."""
    try:
        from .._nativeapi import check_trusted
        check_trusted(path)
    except (ArchiveFormatError, OSError) as e:
        _log.warning(f"archive written to {path}, but SHARE runs will refuse it: {e}")


# ---- one archive per DUMP session -----------------------------------------

def _session_is_ours(session):
    """Return whether this interpreter is the one session began with.

    Whether this process's interpreter is the one ``session`` began with
    (an id without a tag, made by hand or by an older pycds: taken as ours).
    A member of a DUMP session that is not -- a child run by another Python,
    or with another -O or -X no_debug_ranges -- does not write over an
    archive of its session: its code could not share it, and replacing it
    would drop what the others wrote."""
    _, dash, tag = session.rpartition("-")
    if not dash or len(tag) != 16:
        return True
    return tag == _archive.interpreter_tag()


def _session_of(path):
    """The DUMP session that wrote the archive at ``path``, or None."""
    try:
        index = _archive.Index.open(path, check_interpreter=False)
    except ArchiveFormatError:
        return None
    try:
        return archive_session(index)
    finally:
        index.close()


# Where an archive written in a DUMP session names it (_write).
SESSION_XATTR = "user.pycds.session"


def archive_session(index):
    """Return the DUMP session that wrote index's archive, or None.

    The DUMP session that wrote the archive of ``index`` (an
    :class:`pycds._archive.Index`), or None: its extended attribute, else
    its meta (a file system without extended attributes)."""
    try:
        return os.getxattr(index.fd if index.fd >= 0 else index.path,
                           SESSION_XATTR).decode("utf-8", "replace")
    except (OSError, AttributeError):
        return index.meta.get("session")


def _carry_over(path, session, entries, archive_id, heap_len, nrelocs, nstrings, N):
    """Return the modules of the archive at path that entries lacks.

    The modules of the archive at ``path`` that ``entries`` lacks, if it
    was made by this interpreter build and, unless ``session`` is True, in
    the DUMP session ``session``: returns ``(entries, heap parts,
    relocation parts)`` to append, each chunk checked against its old
    checksum, its interned strings numbered after the ``nstrings`` of the
    archive being written (docs/archive-format.md), and re-signed for
    ``archive_id``."""
    out = ([], [], [])
    if not session:
        return out
    try:
        index = _archive.Index.open(path)
    except ArchiveFormatError:
        return out
    try:
        if (session is not True and archive_session(index) != session) or \
                index.meta.get("layout") != N.layout_id():
            return out
        have = {e.name for e in entries}
        h = index.header
        numbers = N.Renumbering(nstrings, h.reloc_count)
        for old in index.entries():
            if old.name in have:
                continue
            chunk = os.pread(index.fd, old.chunk_len, h.heap_off + old.chunk_off)
            rel = os.pread(index.fd, 4 * old.reloc_count,
                           h.reloc_off + 4 * old.reloc_first)
            if len(chunk) != old.chunk_len or len(rel) != 4 * old.reloc_count or \
                    old.chunk_len % 8 or \
                    N.hash64(rel, N.hash64(chunk, h.archive_id)) != old.chunk_sum:
                continue
            try:
                chunk = bytearray(chunk)
                numbers.apply(chunk, rel)
            except NativeError:
                continue
            # 8-aligned, as the writer starts every chunk.
            pad = -heap_len % 8
            if pad:
                out[1].append(bytes(pad))
                heap_len += pad
            old.number = len(entries) + len(out[0])
            old.chunk_off = heap_len
            old.reloc_first = nrelocs
            old.chunk_sum = N.hash64(rel, N.hash64(chunk, archive_id))
            heap_len += len(chunk)
            nrelocs += old.reloc_count
            out[0].append(old)
            out[1].append(chunk)
            out[2].append(rel)
            have.add(old.name)
    except (ArchiveFormatError, OSError):
        return ([], [], [])
    finally:
        index.close()
    return out


def _pycds_version():
    from .._config import __version__
    return __version__


def _native_writer():
    from .. import _nativewriter
    return _nativewriter


def preload():
    """Import what dump_at_exit needs, at the start of a DUMP run.

    Import, at the start of a DUMP run, what :func:`dump_at_exit` needs
    (the native module with ``_cffi_backend`` and its writer's calls,
    ``fcntl``), so
    that the dump does not depend on the import system the program leaves
    at exit: a path hook that raises, ``sys.path`` without site-packages, a
    meta path finder that refuses names.  The import costs the same then as
    at exit.  A failure is left for the dump at exit to report."""
    try:
        _files.fcntl_module()
        import_native(_native_writer, sys.path)     # (the program has not run yet)
    except Exception:
        pass


def dump_at_exit(config):
    """DUMP mode's atexit handler: write the archive; never raise.

    The atexit handler of DUMP mode: never raises, never changes the exit
    status; a failure is one warning saying no archive was written.  Does
    nothing in a subinterpreter (its atexit handlers run when it ends).
    Stops the settle watcher first (pycds.dumping.settle), waiting for a write it
    has begun."""
    from .._config import is_main_interpreter
    from . import settle as _settle
    if not is_main_interpreter():
        return
    lock = _settle.stop()
    try:
        write_archive(config)
    finally:
        lock.release()
        _capture.stop()


# The pid of the process that began this DUMP session, which says in one
# line what it wrote at exit (set by pycds._activate; children say it only
# at PYCDSVERBOSE=1).
announcer = 0
def write_archive(config, announce=True):
    """Write the archive of every module imported so far; never raise.

    Write the archive of every module imported so far (at exit, or once
    imports have settled: pycds.dumping.settle, with ``announce`` false: the exit
    says what was written).  Never raises: a failure is one warning saying
    no archive was written."""
    pairs = snapshot()
    t0 = time.perf_counter()
    try:
        # What start-up imported before pycds.pth ran, a SHARE run imports
        # before its finder too: not archived.
        n, skipped = dump_modules(pairs, config.archive, config.verbose,
                                  _config.dump_session(), skip_preloaded=True)
    except _files.NotReplaceable as e:
        _files.say_not_written(config.archive, e, "DUMP wrote no archive", "PYCDSARCHIVE")
        return
    except BaseException as e:
        _log.warning(f"no archive was written to {config.archive}: "
                     f"{str(e) or type(e).__name__}")
        return
    ms = (time.perf_counter() - t0) * 1e3
    if announce and announcer == os.getpid() and not config.quiet:
        try:
            size = os.stat(config.archive).st_size
            size = f" ({size / 2**20:.1f} MiB)" if size >= 2**20 else f" ({size >> 10} KiB)"
        except OSError:
            size = ""
        if config.archive == _config.default_archive_path():
            use = "runs with PYCDSMODE=SHARE or AUTO use it"
        else:
            use = f"run with PYCDSMODE=SHARE PYCDSARCHIVE={config.archive} to use it"
        _log.say(f"wrote {n} module{'' if n == 1 else 's'} to {config.archive}{size}: {use}")
    else:
        _log.verbose(f"dumped {n} modules ({skipped} skipped) to {config.archive} "
                     f"in {ms:.1f} ms", 1)


def import_and_dump(names, archive):
    """Import names, archive what is imported; return the count or raise.

    Import ``names`` (module names, in order; failures reported and
    skipped) and write an archive of every module imported so far to
    ``archive`` ("": ``$PYCDSARCHIVE``, else the default per-program
    path); the number of modules archived.  Raises ValueError (no archive
    path), OSError (not written)."""
    import importlib
    import os
    if not archive:
        archive = _config._absolute(os.environ.get("PYCDSARCHIVE", "")) \
            or _config.default_archive_path()
    if not archive:
        raise ValueError("no archive path: pass one or set PYCDSARCHIVE")
    # (Before the imports: a path that holds a file of the user's costs nothing.)
    _files.check_replaceable(archive, _archive.ARCHIVE_FILE)
    for name in names or ():
        if name in ("__main__", "__mp_main__") or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:
            raise
        except BaseException as e:   # a listed module may fail, or exit
            _log.warning(f"module {name!r} not archived: importing it raised "
                         f"{type(e).__name__}: {e}")
    # Laid out from the names given, in their order (pycds.dumping.order).
    n, _ = dump_modules(snapshot(), archive, roots=names or None)
    return n


def read_module_list(path):
    """Return the module names the list file at path holds; raise OSError, ValueError.

    One name a line; blank lines and lines starting with ``#`` are left
    out.  ValueError: the file is not UTF-8 text."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a UTF-8 module list (byte "
                         f"{data[e.start]:#04x} at offset {e.start})") from None
    return [line.strip() for line in text.split("\n")
            if line.strip() and not line.lstrip().startswith("#")]


def dump_now(names, archive):
    """Import names, archive what is imported; return the count, or raise OSError.

    :func:`import_and_dump`, with the code objects of the modules it
    imports kept as they run (pycds.dumping.capture: an audit hook, which
    stays in the process, idle, once this returns), so that most need not
    be read again.  pycds.dump and pycds._dump's work."""
    own_capture = not _capture.active() and _capture.install()
    try:
        return import_and_dump(names, archive)
    finally:
        if own_capture:
            _capture.stop()
