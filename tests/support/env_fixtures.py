"""Helpers for environment tests: a prefix's hash, wheels and slow sdists built in the test.

``prefix_hash(path)`` covers every path below the prefix with its kind, permission bits,
content (sha256) and symlink target, so "unchanged" means byte-for-byte unchanged (V8).
``make_wheel`` writes a real wheel (zip with METADATA, WHEEL and a RECORD that hashes every
file) without any build tool. ``make_slow_sdist`` writes an sdist with an in-tree build backend
that needs nothing from an index, and whose build can misbehave on purpose: write into the
prefix and then hang (for kill -9 tests) or fail.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import tarfile
import textwrap
import zipfile
from pathlib import Path


def host_prefix(runner_root: Path, environment_id: str) -> Path:
    """Where a runner rooted at ``runner_root`` keeps an environment's prefix on the host
    (``EnvironmentStore.prefix``: ``<root>/environments/<id>/prefix``). The doors show where
    commands see it (/env, V4), so a test reading the prefix's files asks here."""
    path = runner_root / "environments" / environment_id / "prefix"
    assert path.is_dir(), f"no prefix at {path}"
    return path


def prefix_hash(path: Path | str) -> str:
    """sha256 over (relative path, kind, mode, content hash or link target) of every entry."""
    root = Path(path)
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            full = Path(folder) / name
            rel = full.relative_to(root).as_posix()
            st = full.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                detail = "l:" + os.readlink(full)
            elif stat.S_ISDIR(st.st_mode):
                detail = "d"
            elif stat.S_ISREG(st.st_mode):
                content = hashlib.sha256()
                with full.open("rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        content.update(chunk)
                detail = "f:" + content.hexdigest()
            else:
                detail = f"other:{stat.S_IFMT(st.st_mode)}"
            digest.update(f"{rel}\0{mode:o}\0{detail}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _record_hash(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    modules: dict[str, str] | None = None,
    requires: list[str] | None = None,
) -> Path:
    """A pure-Python wheel ``<name>-<version>-py3-none-any.whl`` in ``folder``; ``modules``
    maps file paths inside site-packages to their text (default: ``<name>.py`` defining
    ``VERSION``)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    modules = modules or {f"{dist}.py": f"VERSION = {version!r}\n"}
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    for requirement in requires or []:
        metadata += f"Requires-Dist: {requirement}\n"
    files = {path: text.encode() for path, text in modules.items()}
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: shellyard-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{info}/RECORD,,\n"
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", record)
    return wheel


def make_slow_sdist(
    folder: Path,
    name: str,
    version: str,
    prefix: Path,
    behaviour: str,
    probe: list[Path] | None = None,
) -> Path:
    """An sdist whose in-tree build backend, when uv builds it inside the tool sandbox,
    damages ``prefix`` (seen at /env by the build, V4) the way a half-done install would
    (adds a file, rewrites one, removes one, changes a mode), writes
    ``<prefix>/.build-started`` and then ``behaviour``:
    ``hang`` (sleeps; the test kills the runner), ``fail`` (exits non-zero) or
    ``sleep-fail:SECONDS`` (fails after that long: a change that outlives its driver).

    ``.build-started`` holds JSON: the build's view of the sandbox — ``seen`` (which of the
    ``probe`` paths exist there), ``cap_eff`` (its effective capabilities), ``uid``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    backend = textwrap.dedent(
        f"""
        import glob, json, os, sys, time

        # V4: the tool's sandbox shows a prefix at /env; one built before, at its own path
        PREFIX = {str(prefix)!r} if os.path.isdir({str(prefix)!r}) else "/env"
        PROBE = {[str(p) for p in probe or []]!r}

        def _damage():
            site = glob.glob(os.path.join(PREFIX, "lib", "python*", "site-packages"))[0]
            with open(os.path.join(site, "half_installed.py"), "w") as f:
                f.write("broken = True\\n")
            os.makedirs(os.path.join(site, "half_pkg", "sub"), exist_ok=True)
            with open(os.path.join(site, "half_pkg", "sub", "x.py"), "w") as f:
                f.write("x = 1\\n")
            cfg = os.path.join(PREFIX, "pyvenv.cfg")
            with open(cfg, "a") as f:
                f.write("damaged = yes\\n")
            os.chmod(os.path.join(PREFIX, "bin", "uv"), 0o700)
            victims = sorted(glob.glob(os.path.join(site, "*.dist-info", "INSTALLER")))
            if victims:
                os.unlink(victims[0])
            os.symlink("/nowhere", os.path.join(PREFIX, "bin", "dangling"))
            cap_eff = ""
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("CapEff:"):
                        cap_eff = line.split()[1]
            view = {{
                "seen": {{p: os.path.exists(p) for p in PROBE}},
                "cap_eff": cap_eff,
                "uid": os.getuid(),
            }}
            # Whole or not at all: tests read it as soon as it exists.
            with open(os.path.join(PREFIX, ".build-started.tmp"), "w") as f:
                json.dump(view, f)
            os.replace(
                os.path.join(PREFIX, ".build-started.tmp"), os.path.join(PREFIX, ".build-started")
            )

        def get_requires_for_build_wheel(config_settings=None):
            return []

        def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
            info = os.path.join(metadata_directory, "{dist}-{version}.dist-info")
            os.makedirs(info)
            with open(os.path.join(info, "METADATA"), "w") as f:
                f.write("Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n")
            return "{dist}-{version}.dist-info"

        def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
            _damage()
            if {behaviour!r} == "fail":
                sys.exit("the slow package refuses to build")
            if {behaviour!r}.startswith("sleep-fail:"):
                time.sleep(float({behaviour!r}.split(":")[1]))
                sys.exit("the slow package gave up building")
            time.sleep(600)
            sys.exit("woke up")
        """
    )
    pyproject = textwrap.dedent(
        """
        [build-system]
        requires = []
        build-backend = "backend"
        backend-path = ["."]
        """
    )
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    sdist = folder / f"{dist}-{version}.tar.gz"
    top = f"{dist}-{version}"
    with tarfile.open(sdist, "w:gz") as archive:
        for path, text in (
            ("pyproject.toml", pyproject),
            ("backend.py", backend),
            ("PKG-INFO", pkg_info),
        ):
            data = text.encode()
            member = tarfile.TarInfo(f"{top}/{path}")
            member.size = len(data)
            member.mode = 0o644
            archive.addfile(member, io.BytesIO(data))
    return sdist


def backend_sdist(name: str, version: str, backend_body: str) -> bytes:
    """An sdist with an in-tree backend: ``backend_body`` runs in ``build_wheel`` and sets
    ``RESULT`` (any JSON value), which the built wheel's module ``<name>`` exposes."""
    dist = name.replace("-", "_")
    head = "import base64, hashlib, json, os, zipfile\n\ndef _run():\n"
    run = textwrap.indent(textwrap.dedent(backend_body), "    ") + "    return RESULT\n"
    tail = textwrap.dedent(
        f"""
        def get_requires_for_build_wheel(config_settings=None):
            return []

        def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
            result = _run()
            info = "{dist}-{version}.dist-info"
            meta = "Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n"
            wheel_text = "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
            files = {{
                "{dist}.py": ("RESULT = " + repr(json.dumps(result)) + "\\n").encode(),
                info + "/METADATA": meta.encode(),
                info + "/WHEEL": wheel_text.encode(),
            }}
            def h(b):
                d = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=")
                return "sha256=" + d.decode()
            record = "".join(f"{{p}},{{h(b)}},{{len(b)}}\\n" for p, b in files.items())
            record += info + "/RECORD,,\\n"
            wheel = "{dist}-{version}-py3-none-any.whl"
            with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
                for p, b in files.items():
                    z.writestr(p, b)
                z.writestr(info + "/RECORD", record)
            return wheel
        """
    )
    backend = head + run + tail
    pyproject = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    out = io.BytesIO()
    top = f"{dist}-{version}"
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path, text in (("pyproject.toml", pyproject), ("backend.py", backend),
                           ("PKG-INFO", pkg_info)):  # fmt: skip
            data = text.encode()
            member = tarfile.TarInfo(f"{top}/{path}")
            member.size, member.mode = len(data), 0o644
            archive.addfile(member, io.BytesIO(data))
    return out.getvalue()
