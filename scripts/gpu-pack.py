#!/usr/bin/env python3
"""What a GPU run (scripts/gpu-run.sh) hands back: the device call returns at most 8 files of at most 16 MiB each, at
most two folders deep under $OUT. The run writes everything into a scratch folder (RUN_DIR); this puts into OUT_DIR

    summary.txt   steps.tsv   env.txt   files.tar.gz

the first three copied as they are, the archive holding the whole RUN_DIR (logs, test results, model metrics, cuDNN's
logs, the peer's results, the clocks). A file over 2 MiB travels as its last 2 MiB (the archive's MANIFEST says
which); if the archive is still over 15 MiB the largest files are left out, each named in the
MANIFEST. Each file is written beside its place and renamed into it, so a run stopped at any moment leaves the
previous complete set.

    gpu-pack.py RUN_DIR OUT_DIR             pack one run (gpu-run.sh does after every step)
    gpu-pack.py --check DIR                 DIR holds what comes back: at most 8 files, 2 folders deep, 16 MiB each
    gpu-pack.py --check-fixtures DIR        pack every sample run DIR/*/run into a scratch folder, --check it and
                                            check that the archive holds every file of the sample run

Standard library only.
"""

import io
import os
import shutil
import sys
import tarfile
import tempfile

MAX_FILES = 8
MAX_DEPTH = 2  # folders under OUT
MAX_FILE_BYTES = 16 * 2**20
ARCHIVE_CAP = 15 * 2**20  # under the 16 MiB a file may have, with room to spare
PER_FILE_CAP = 2 * 2**20
TOP_FILES = ("summary.txt", "steps.tsv", "env.txt")
ARCHIVE = "files.tar.gz"


def run_files(run_dir):
    """(relative path, size) of every plain file under run_dir, sorted."""
    out = []
    for root, _, files in os.walk(run_dir):
        for f in files:
            path = os.path.join(root, f)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append((os.path.relpath(path, run_dir), os.path.getsize(path)))
    return sorted(out)


def build_archive(run_dir, files, left_out):
    buf = io.BytesIO()
    manifest = []
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for rel, size in files:
            if rel in left_out:
                manifest.append(f"{rel}: left out ({size} bytes; the archive would exceed {ARCHIVE_CAP >> 20} MiB)")
                continue
            path = os.path.join(run_dir, rel)
            try:
                with open(path, "rb") as f:
                    if size > PER_FILE_CAP:
                        f.seek(size - PER_FILE_CAP)
                        manifest.append(f"{rel}: its last {PER_FILE_CAP >> 20} MiB of {size} bytes")
                    data = f.read(PER_FILE_CAP)
            except OSError as e:
                manifest.append(f"{rel}: unreadable ({e})")
                continue
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mtime = int(os.path.getmtime(path))
            tar.addfile(info, io.BytesIO(data))
        text = ("\n".join(manifest) + "\n" if manifest else "every file whole\n").encode()
        info = tarfile.TarInfo("MANIFEST")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def write_atomically(path, data):
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def pack(run_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name in TOP_FILES:
        src = os.path.join(run_dir, name)
        if os.path.isfile(src):
            with open(src, "rb") as f:
                write_atomically(os.path.join(out_dir, name), f.read()[-MAX_FILE_BYTES:])
    files = run_files(run_dir)
    left_out = set()
    data = build_archive(run_dir, files, left_out)
    for rel, _ in sorted(files, key=lambda x: -x[1]):
        if len(data) <= ARCHIVE_CAP:
            break
        left_out.add(rel)
        data = build_archive(run_dir, files, left_out)
    write_atomically(os.path.join(out_dir, ARCHIVE), data)
    return 0


def check(out_dir):
    """What would come back from out_dir: the problems, one line each (none: it fits)."""
    problems, count = [], 0
    for root, dirs, files in os.walk(out_dir):
        depth = len(os.path.relpath(root, out_dir).split(os.sep)) if root != out_dir else 0
        if depth > MAX_DEPTH:
            problems.append(f"{os.path.relpath(root, out_dir)}: {depth} folders deep (at most {MAX_DEPTH} come back)")
        for f in files:
            count += 1
            size = os.path.getsize(os.path.join(root, f))
            if size > MAX_FILE_BYTES:
                problems.append(f"{os.path.relpath(os.path.join(root, f), out_dir)}: {size} bytes (at most "
                                f"{MAX_FILE_BYTES} come back)")
    if count > MAX_FILES:
        problems.append(f"{count} files (at most {MAX_FILES} come back)")
    return problems


def check_fixtures(root):
    bad = 0
    cases = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, "run")))
    for case in cases:
        run_dir = os.path.join(root, case, "run")
        out = tempfile.mkdtemp(prefix="gpu-pack-")
        try:
            pack(run_dir, out)
            problems = check(out)
            with tarfile.open(os.path.join(out, ARCHIVE)) as tar:
                names = set(tar.getnames())
            missing = [rel for rel, _ in run_files(run_dir) if rel not in names]
            problems += [f"{rel}: not in {ARCHIVE}" for rel in missing]
            problems += [f"{name}: not copied" for name in TOP_FILES
                         if os.path.isfile(os.path.join(run_dir, name)) and
                         not os.path.isfile(os.path.join(out, name))]
            for p in problems:
                print(f"{case}: {p}")
            bad += len(problems)
            print(f"{case}: {len(os.listdir(out))} files come back, "
                  f"{os.path.getsize(os.path.join(out, ARCHIVE))} bytes of archive")
        finally:
            shutil.rmtree(out, ignore_errors=True)
    if not cases:
        print(f"no sample runs under {root}")
        return 1
    return 1 if bad else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        problems = check(argv[2])
        for p in problems:
            print(f"gpu-pack: {p}")
        return 1 if problems else 0
    if len(argv) == 3 and argv[1] == "--check-fixtures":
        return check_fixtures(argv[2])
    if len(argv) == 3 and not argv[1].startswith("--"):
        return pack(argv[1], argv[2])
    print(__doc__.split("\n\n")[3], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
