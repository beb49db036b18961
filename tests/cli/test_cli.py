"""python -m pycds info / verify / dump / cache, and the command line itself:
--version, help, errors, counts."""

import argparse
import os
import platform
import re
import subprocess
import sys
import time

import pycds

from support import clean_env, flip_bits, run_python


def make_archive(tmp_path):
    (tmp_path / "alpha.py").write_text("A = 1\n")
    (tmp_path / "beta.py").write_text("B = 2\n")
    img = str(tmp_path / "a.img")
    r = run_python(["-c", "import alpha, beta"], cwd=tmp_path, PYCDSMODE="DUMP",
                   PYCDSARCHIVE=img)
    assert r.rc == 0 and os.path.exists(img), r
    return img


class TestCli:
    def test_info(self, tmp_path):
        img = make_archive(tmp_path)
        r = run_python(["-m", "pycds", "info", img], cwd=tmp_path)
        assert r.rc == 0, r
        assert "interpreter:" in r.out and "heap:" in r.out and "relocations:" in r.out
        lines = [l for l in r.out.splitlines() if l.startswith(("alpha ", "beta "))]
        assert len(lines) == 2

    def test_verify_lists_changed_sources(self, tmp_path):
        img = make_archive(tmp_path)
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        assert r.rc == 0 and r.out.strip().endswith("modules changed since the dump")
        st = os.stat(tmp_path / "beta.py")
        (tmp_path / "beta.py").write_text("B = 3\n")
        os.utime(tmp_path / "beta.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        # alpha only touched: its bytes are the dumped ones.
        st = os.stat(tmp_path / "alpha.py")
        os.utime(tmp_path / "alpha.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        assert r.rc == 1 and "beta: source hash differs" in r.out and "alpha:" not in r.out, r
        (tmp_path / "beta.py").write_text("B = 333\n")
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        assert r.rc == 1 and "beta: source changed" in r.out and "alpha:" not in r.out, r

    def test_verify_checks_as_pycdscheck_says(self, tmp_path):
        """An edit that keeps size and mtime: only a source hash sees it, and
        verify compares hashes when PYCDSCHECK=hash, as SHARE then does."""
        img = make_archive(tmp_path)
        beta = tmp_path / "beta.py"
        st = os.stat(beta)
        beta.write_text("B = 7\n")           # was "B = 2\n": same size
        os.utime(beta, ns=(st.st_atime_ns, st.st_mtime_ns))
        plain = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        hashed = run_python(["-m", "pycds", "verify", img], cwd=tmp_path, PYCDSCHECK="hash")
        assert plain.rc == 0, plain
        assert hashed.rc == 1 and "beta: source hash differs" in hashed.out, hashed

    def test_verify_reads_the_pyc_plain_import_would_read(self, tmp_path):
        """Under PYTHONPYCACHEPREFIX plain import reads another .pyc than the
        dump's: an unchecked hash-based one there runs whatever it holds, and
        verify says what SHARE does (it looked at the dumped path)."""
        img = make_archive(tmp_path)
        prefix = str(tmp_path / "prefix")
        subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode",
                        "unchecked-hash", str(tmp_path / "beta.py")], check=True,
                       env=clean_env(PYTHONPYCACHEPREFIX=prefix))
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path,
                       PYTHONPYCACHEPREFIX=prefix)
        assert r.rc == 1, r
        assert "beta: an unchecked hash-based .pyc replaced the dumped one" in r.out, r
        s = run_python(["-c", "import alpha, beta"], cwd=tmp_path, PYTHONPYCACHEPREFIX=prefix,
                       PYCDSMODE="SHARE", PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "[pycds] fallback beta: an unchecked hash-based .pyc replaced the dumped one" \
            in s.fallbacks(), s

    def test_not_an_archive(self, tmp_path):
        bad = tmp_path / "bad.img"
        bad.write_bytes(b"hello" * 100)
        r = run_python(["-m", "pycds", "info", str(bad)], cwd=tmp_path)
        assert r.rc == 2 and "not a pycds archive" in r.err

    def test_dump_command(self, tmp_path):
        lst = tmp_path / "mods.lst"
        lst.write_text("json\nemail.parser\n")
        img = str(tmp_path / "c.img")
        r = run_python(["-m", "pycds", "dump", str(lst), img], cwd=tmp_path)
        assert r.rc == 0 and os.path.exists(img), r
        s = run_python(["-c", "import email.parser"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img, PYCDSVERBOSE=1)
        assert "email.parser" in s.served()

    def test_dump_command_errors_are_one_line(self, tmp_path):
        lst = tmp_path / "mods.lst"
        lst.write_text("json\n")
        (tmp_path / "file").write_text("")
        for args in ([str(tmp_path / "missing.lst"), str(tmp_path / "a.img")],
                     [str(lst), str(tmp_path / "file" / "a.img")],
                     [str(lst), str(tmp_path)]):
            r = run_python(["-m", "pycds", "dump", *args], cwd=tmp_path)
            assert r.rc == 2 and "Traceback" not in r.err, r
            assert r.err.startswith("pycds: ") and len(r.err.splitlines()) == 1, r

    def test_dump_of_a_list_that_is_not_utf8_names_the_file(self, tmp_path):
        lst = tmp_path / "mods.lst"
        lst.write_bytes(b"json\ncsv\xb1\n")
        r = run_python(["-m", "pycds", "dump", str(lst), str(tmp_path / "a.img")],
                       cwd=tmp_path)
        assert r.rc == 2 and len(r.err.splitlines()) == 1, r
        assert f"pycds: {lst}: not a UTF-8 module list (byte 0xb1 at offset 8)" in r.err, r


def flat(text):
    """``text`` with its whitespace runs made single spaces: help text as
    words, whatever width and layout argparse gives it (3.13 changed some)."""
    return " ".join(text.split())


def agrees(n, noun):
    """Whether ``noun`` is in the number ``n`` asks for ("1 module", "2 modules")."""
    return noun.endswith(("s", "ies")) != (int(n) == 1)


# Words of a message a user should never meet: Python exception classes,
# errno numbers, a traceback, the names of pycds's modules and of argparse's
# destinations.
INTERNAL = re.compile(r"Traceback|[a-z]Error\b|Exception\b|\[Errno|pycds\._|_native|"
                      r"cache_command|argument command\b|\bfunc\b")


class TestCliUsage:
    """The command line as pip's, pytest's and git's users expect it."""

    def test_version(self, tmp_path):
        r = run_python(["-m", "pycds", "--version"], cwd=tmp_path)
        assert r.rc == 0 and r.err == "", r
        assert r.out.startswith(f"pycds {pycds.__version__} "), r
        assert f"{platform.python_implementation()} {platform.python_version()}" in r.out, r
        assert sys.executable in r.out and len(r.out.splitlines()) == 1, r
        assert run_python(["-m", "pycds", "-V"], cwd=tmp_path).out == r.out

    def test_help_names_the_modes_commands_and_docs(self, tmp_path):
        r = run_python(["-m", "pycds", "--help"], cwd=tmp_path)
        assert r.rc == 0 and r.err == "", r
        lines = [line.split() for line in r.out.splitlines()]
        for mode in ("AUTO", "DUMP", "SHARE", "TRACE"):
            # one line each, saying what it does
            assert sum(w[:1] == [f"PYCDSMODE={mode}"] and len(w) > 3 for w in lines) == 1, r
        for command in ("info", "verify", "dump", "bench", "cache"):
            assert sum(w[:1] == [command] and len(w) > 2 for w in lines) == 1, (command, r)
        assert "README.md" in r.out and "docs/env-vars.md" in r.out, r
        assert "--version" in r.out

    def test_no_command_prints_the_help(self, tmp_path):
        # as pip does: the help on stdout, exit status 0
        r = run_python(["-m", "pycds"], cwd=tmp_path)
        assert r.rc == 0 and r.err == "", r
        assert r.out == run_python(["-m", "pycds", "--help"], cwd=tmp_path).out

    def test_cache_alone_prints_the_cache_help(self, tmp_path):
        r = run_python(["-m", "pycds", "cache"], cwd=tmp_path)
        assert r.rc == 0 and r.err == "" and "required" not in r.out, r
        assert r.out == run_python(["-m", "pycds", "cache", "--help"], cwd=tmp_path).out
        lines = [line.split() for line in r.out.splitlines()]
        for command in ("list", "clear", "path"):
            assert sum(w[:1] == [command] and len(w) > 2 for w in lines) == 1, (command, r)

    def test_subcommand_help_says_what_each_does(self, tmp_path):
        said = {
            ("info",): ["ARCHIVE", "the archive file", "header", "header only"],
            ("dump",): ["LIST", "ARCHIVE", "module names, one a line", "TRACE",
                        "replaced only if it is a pycds archive", "Exit status"],
            ("cache", "list"): ["List the default archives", "stale", "program"],
            ("cache", "clear"): ["Remove the default archives", "--older-than DAYS"],
            ("cache", "path"): ["Print the path of the default archive", "after --"],
            ("bench",): ["--reps", "ratio", "Exit status"],
        }
        for words, expected in said.items():
            r = run_python(["-m", "pycds", *words, "--help"], cwd=tmp_path)
            assert r.rc == 0 and r.err == "", r
            for text in expected:
                assert text in flat(r.out), (words, text, r.out)

    def test_verify_help_says_what_the_readme_says(self, tmp_path):
        r = run_python(["-m", "pycds", "verify", "--help"], cwd=tmp_path)
        assert r.rc == 0, r
        text = flat(r.out)
        for words in ("sources changed since the dump", "fail their checksums", "damaged",
                      "whether SHARE would refuse the file", "permissions",
                      "1 when a module changed, a part is damaged or SHARE would refuse"):
            assert words in text, (words, r.out)

    def test_every_argument_and_subcommand_has_help(self):
        # The parser python -m pycds uses, walked: a new argument without
        # help text fails here.  Only the command lines taken after "--"
        # are left out of the list (their usage line shows them).
        from pycds.cli.main import parser

        def walk(p, path):
            assert p.description, path
            for action in p._actions:
                if isinstance(action, argparse._SubParsersAction):
                    helps = {a.dest: a.help for a in action._choices_actions}
                    for name, sub in action.choices.items():
                        assert helps.get(name), path + [name]
                        yield from walk(sub, path + [name])
                elif action.help == argparse.SUPPRESS:
                    assert action.nargs == argparse.REMAINDER, (path, action.dest)
                else:
                    assert action.help, (path, action.dest)
                    yield path, action
        assert len(list(walk(parser(), ["python -m pycds"]))) > 15

    def test_errors_name_nothing_internal(self, tmp_path):
        lst = tmp_path / "mods.lst"
        lst.write_text("json\n")
        (tmp_path / "garbage.img").write_bytes(b"garbage" * 100)
        # a Python without pycds (no site-packages)
        bare = tmp_path / "python3-bare"
        bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
        bare.chmod(0o755)
        for args in (["bogus"], ["--bogus"], ["cache", "bogus"], ["info"], ["dump", "x"],
                     ["verify", "--check", "sha", "a.img"], ["info", "missing.img"],
                     ["info", "garbage.img"], ["verify", str(tmp_path)],
                     ["cache", "clear", "--older-than", "x"],
                     ["dump", "missing.lst", "a.img"], ["dump", str(lst), str(tmp_path)],
                     ["cache", "path"], ["cache", "path", "--", str(tmp_path / "absent")],
                     ["cache", "path", "--", str(bare), "app.py"],
                     ["bench", "--reps", "0", "--", sys.executable, "-c", "pass"],
                     ["bench", "--", str(tmp_path / "absent")]):
            r = run_python(["-m", "pycds", *args], cwd=tmp_path)
            assert r.rc == 2 and r.out == "", (args, r)
            assert r.err.startswith(("usage:", "pycds")), (args, r)
            assert not INTERNAL.search(r.err), (args, r)
        r = run_python(["-m", "pycds", "cache", "path", "--", str(bare), "app.py"],
                       cwd=tmp_path)
        assert "pycds is not installed for it" in r.err, r
        r = run_python(["-m", "pycds", "dump", "missing.lst", "a.img"], cwd=tmp_path)
        assert r.err == "pycds: missing.lst: No such file or directory\n", r
        # A command that is not a Python is not run to be asked.
        prog = tmp_path / "prog"
        prog.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\n")
        prog.chmod(0o755)
        r = run_python(["-m", "pycds", "cache", "path", "--", str(prog)], cwd=tmp_path)
        assert r.rc == 2 and "is not a Python interpreter" in r.err, r
        assert not (tmp_path / "ran").exists()

    def test_a_checkout_in_the_working_directory_is_named(self, tmp_path):
        """From a source tree with no native module built (the checkout's
        root), a command that needs it says what to do in one line."""
        import shutil
        img = make_archive(tmp_path)
        tree = tmp_path / "checkout"
        shutil.copytree(os.path.dirname(pycds.__file__), tree / "pycds",
                        ignore=shutil.ignore_patterns("*.so", "__pycache__", "bf16"))
        (tree / "setup.py").write_text("")
        r = run_python(["-m", "pycds", "verify", img], cwd=tree)
        assert r.rc == 2 and len(r.err.splitlines()) == 1, r
        assert f"is the source checkout {tree / 'pycds'}, not the installed one" in r.err, r
        assert "run this command from another directory" in r.err, r
        assert not INTERNAL.search(r.err), r
        v = run_python(["-m", "pycds", "--version"], cwd=tree)
        assert v.rc == 0 and f" from {tree / 'pycds'} (" in v.out, v
        # An installed copy without it (a broken install): reinstall.
        (tree / "setup.py").unlink()
        r = run_python(["-m", "pycds", "dump", os.devnull, str(tmp_path / "b.img")], cwd=tree)
        assert r.rc == 2 and len(r.err.splitlines()) == 1, r
        assert r.err.endswith(": reinstall pycds\n") and not INTERNAL.search(r.err), r

    def test_counts_are_in_the_right_number(self, tmp_path):
        img = make_archive(tmp_path)
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        m = re.search(r"^0 of (\d+) (\w+) changed since the dump$", r.out, re.M)
        assert m and agrees(m.group(1), m.group(2)), r
        r = run_python(["-m", "pycds", "info", "-q", img], cwd=tmp_path)
        m = re.search(r"^relocations: +(\d+) (\w+) \((\d+) (\w+)\)$", r.out, re.M)
        assert m and agrees(*m.group(1, 2)) and agrees(*m.group(3, 4)), r
        for label in ("heap", "chunk table", "file"):
            m = re.search(rf"^{label}: +(\d+) (\w+)$", r.out, re.M)
            assert m and agrees(*m.group(1, 2)), (label, r)
        from pycds.cli.cache import counted
        assert [counted(n, "archive") for n in (0, 1, 2)] == \
            ["0 archives", "1 archive", "2 archives"]
        assert counted(1, "entry", "entries") == "1 entry"
        assert counted(3, "entry", "entries") == "3 entries"


class TestCliIntegrity:
    def test_verify_reports_damaged_chunks(self, tmp_path):
        img = make_archive(tmp_path)
        from pycds import _archive
        index = _archive.Index.open(img)
        entry = index.lookup("beta")
        at = index.header.heap_off + entry.chunk_off + entry.chunk_len // 2
        index.close()
        flip_bits(img, at, 0x01)
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        assert r.rc == 1, r
        assert "beta: archived data fails its checksum" in r.out
        assert "alpha:" not in r.out
        assert re.search(r"^1 of \d+ modules \(and tables\) damaged in the archive$",
                         r.out, re.M), r.out

    def test_verify_reports_a_damaged_chunk_table(self, tmp_path):
        img = make_archive(tmp_path)
        from pycds import _archive
        index = _archive.Index.open(img)
        at = index.header.chunks_off + 1
        index.close()
        flip_bits(img, at, 0x08)
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        assert r.rc == 1, r
        assert "chunk table fails its checksum" in r.out
        # the first module's record no longer matches its entry
        assert "archived data fails its checksum" in r.out

    def test_info_into_a_closed_pipe_is_quiet(self, tmp_path):
        img = make_archive(tmp_path)
        # the reader (say, `| head`) is gone before the first line is written
        # (clean_env: no PYTHONUNBUFFERED, so stdout is block-buffered and
        # the write that finds the pipe closed is the flush at exit.)
        p = subprocess.Popen([sys.executable, "-m", "pycds", "info", img],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                             env=clean_env())
        p.stdout.close()
        err = p.stderr.read().decode()
        p.wait(timeout=60)
        assert p.returncode == 1 and err == "", err

    def test_verify_says_share_would_refuse_loose_permissions(self, tmp_path):
        img = make_archive(tmp_path)
        os.chmod(img, 0o666)
        r = run_python(["-m", "pycds", "verify", img], cwd=tmp_path)
        assert r.rc == 1 and "SHARE would ignore this archive: writable by group or others" \
            in r.out, r

    def test_unbuilt_source_tree_says_so(self, tmp_path):
        # a checkout as working directory shadows the installed package
        import shutil
        import pycds
        src = os.path.dirname(pycds.__file__)
        shutil.copytree(src, tmp_path / "pycds",
                        ignore=shutil.ignore_patterns("*.so", "__pycache__", "bf16"))
        (tmp_path / "setup.py").write_text("")        # what makes it a checkout
        r = run_python(["-c", "import pycds._nativeapi"], cwd=tmp_path)
        assert r.rc == 1 and "run from another directory" in r.err.lower(), r

    def test_info_on_foreign_archive_shows_header(self, tmp_path):
        import marshal
        img = make_archive(tmp_path)
        from pycds import _archive
        index = _archive.Index.open(img)
        meta = dict(index.meta)
        index.close()
        h = _archive.Header.unpack(open(img, "rb").read())
        # same length, so the meta block keeps its size
        meta["version"] = ("9.99.0 fabricated " + "x" * 500)[:len(meta["version"])]
        meta_b = marshal.dumps(meta)
        assert len(meta_b) == h.meta_len
        data = bytearray(open(img, "rb").read())
        data[h.meta_off:h.meta_off + h.meta_len] = meta_b
        h.meta_sum = _archive.checksum(meta_b, h.archive_id)
        data[:_archive.HEADER_SIZE] = h.pack()
        open(img, "wb").write(data)
        r = run_python(["-m", "pycds", "info", "-q", img], cwd=tmp_path)
        assert r.rc == 0, r
        assert "usable here:  no, made by another interpreter (version" in r.out
        # (Opened at the program's first import.)
        s = run_python(["-c", "import json; print('ok')"], cwd=tmp_path, PYCDSMODE="SHARE",
                       PYCDSARCHIVE=img)
        assert s.out == "ok\n" and "made by another interpreter" in s.warnings()[0]


class TestCacheCommands:
    """python -m pycds cache list|clear|path on a populated cache."""

    def populate(self, tmp_path):
        cache = tmp_path / "xdg"
        (tmp_path / "app.py").write_text("import json\nprint('app')\n")
        (tmp_path / "m.py").write_text("X = 1\n")
        env = {"XDG_CACHE_HOME": str(cache)}
        for args in (["app.py"], ["-c", "import m, csv"]):
            r = run_python(args, cwd=tmp_path, PYCDSMODE="DUMP", **env)
            assert r.rc == 0 and r.err == "", r
        return env, cache / "pycds"

    def test_list_names_program_size_and_staleness(self, tmp_path):
        env, cache = self.populate(tmp_path)
        (tmp_path / "m.py").write_text("X = 22\n")     # one module stale now
        r = run_python(["-m", "pycds", "cache", "list"], cwd=tmp_path, **env)
        assert r.rc == 0, r
        rows = [line.split() for line in r.out.splitlines()[1:-1]]
        assert len(rows) == 2 and r.out.splitlines()[-1] == f"2 archives in {cache}", r
        by_program = {" ".join(row[5:]): row for row in rows}
        app = by_program[f"{sys.executable} app.py"]
        c = by_program[f"{sys.executable} -c 'import m, csv'"]
        assert app[4] == c[4] == "%d.%d.%d" % sys.version_info[:3]
        assert app[3] == "0" and c[3] == "1", r        # stale: m.py edited
        assert int(app[2]) > 3 and int(c[2]) > 1

    def test_path_names_the_archive_a_command_line_uses(self, tmp_path):
        env, cache = self.populate(tmp_path)
        r = run_python(["-m", "pycds", "cache", "path", "--", sys.executable, "app.py"],
                       cwd=tmp_path, **env)
        assert r.rc == 0 and r.out.startswith(str(cache) + os.sep), r
        shared = run_python(["app.py"], cwd=tmp_path, PYCDSMODE="SHARE", PYCDSVERBOSE=1, **env)
        assert "json" in shared.served()
        info = run_python(["-m", "pycds", "info", "-q", r.out.strip()], cwd=tmp_path, **env)
        assert f"program:      {sys.executable} app.py" in info.out, info
        missing = run_python(["-m", "pycds", "cache", "path"], cwd=tmp_path, **env)
        assert missing.rc == 2 and "after --" in missing.err, missing

    def test_clear_removes_old_or_all(self, tmp_path):
        env, cache = self.populate(tmp_path)
        old = sorted(cache.glob("*.img"))[0]
        os.utime(old, (time.time() - 3 * 86400,) * 2)
        r = run_python(["-m", "pycds", "cache", "clear", "--older-than", "2"],
                       cwd=tmp_path, **env)
        assert r.out == "removed 1 of 2 archives\n" and not old.exists(), r
        listed = run_python(["-m", "pycds", "cache", "list"], cwd=tmp_path, **env)
        assert listed.out.splitlines()[-1] == f"1 archive in {cache}", listed
        r = run_python(["-m", "pycds", "cache", "clear"], cwd=tmp_path, **env)
        assert r.out == "removed 1 of 1 archive\n" and list(cache.glob("*.img")) == [], r
        bad = run_python(["-m", "pycds", "cache", "clear", "--older-than", "x"],
                         cwd=tmp_path, **env)
        assert bad.rc == 2 and "number of days" in bad.err, bad

    def test_list_names_the_program_its_archive_is_named_for(self, tmp_path):
        """An archive is named after its program (app-<hash>.img), and cache
        list shows the program, for a script and for -m alike."""
        cache = tmp_path / "xdg"
        (tmp_path / "tool.py").write_text("import json\n")
        (tmp_path / "mymod.py").write_text("import csv\n")
        env = {"XDG_CACHE_HOME": str(cache)}
        for args in (["tool.py"], ["-m", "mymod"]):
            r = run_python(args, cwd=tmp_path, PYCDSMODE="DUMP", **env)
            assert r.rc == 0 and os.path.isdir(cache / "pycds"), r
        names = sorted(os.listdir(cache / "pycds"))
        assert [n.split("-")[0] for n in names] == ["mymod", "tool"], names
        r = run_python(["-m", "pycds", "cache", "list"], cwd=tmp_path, **env)
        assert r.rc == 0, r
        programs = sorted(line.split(None, 5)[5] for line in r.out.splitlines()[1:-1])
        assert programs == [f"{sys.executable} -m mymod", f"{sys.executable} tool.py"], r
        for args, name in ((["-m", "mymod"], "mymod"), (["tool.py"], "tool")):
            p = run_python(["-m", "pycds", "cache", "path", "--", sys.executable, *args],
                           cwd=tmp_path, **env)
            assert p.rc == 0 and os.path.basename(p.out.strip()).startswith(f"{name}-"), p
            assert p.out.strip() in [str(cache / "pycds" / n) for n in names], p
        # -O makes another archive, and cache path names it.
        r = run_python(["-O", "tool.py"], cwd=tmp_path, PYCDSMODE="DUMP", **env)
        assert r.rc == 0, r
        [optimized] = set(os.listdir(cache / "pycds")) - set(names)
        p = run_python(["-m", "pycds", "cache", "path", "--", sys.executable, "-O", "tool.py"],
                       cwd=tmp_path, **env)
        assert p.out.strip() == str(cache / "pycds" / optimized), p
