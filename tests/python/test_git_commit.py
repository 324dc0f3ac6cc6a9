"""The commit a build records (results' git_commit, `latentq --version`) is that of the sources built, read at build
time by cmake/git_commit.cmake: HEAD's 12 hex digits, "-dirty" when a tracked file differs. Checked on a scratch
repository (a commit, an edit, a second commit) and on this checkout against the built binary."""

import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
SCRIPT = os.path.join(ROOT, "cmake", "git_commit.cmake")
CMAKE = shutil.which("cmake")
assert CMAKE, "cmake is not on PATH"


def recorded(src, out):
    subprocess.run([CMAKE, f"-DSRC={src}", f"-DOUT={out}", "-P", SCRIPT], check=True, capture_output=True)
    line = [x for x in open(out).read().splitlines() if x.startswith("#define LATENTQ_GIT_COMMIT")][0]
    return line.split('"')[1]


def git(repo, *args):
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


def test_the_commit_follows_the_tree(tmp_path):
    repo, out = tmp_path / "repo", tmp_path / "commit.h"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "--short=12", "HEAD")
    assert recorded(repo, out) == first
    mtime = os.stat(out).st_mtime_ns
    assert recorded(repo, out) == first and os.stat(out).st_mtime_ns == mtime  # unchanged: not rewritten
    (repo / "a.txt").write_text("two\n")
    assert recorded(repo, out) == first + "-dirty"
    (repo / "untracked.txt").write_text("x\n")
    git(repo, "commit", "-q", "-am", "two")
    second = git(repo, "rev-parse", "--short=12", "HEAD")
    assert second != first and recorded(repo, out) == second  # an untracked file does not make it dirty
    plain = tmp_path / "plain"
    plain.mkdir()
    assert recorded(plain, tmp_path / "none.h") == "unknown"


def test_the_binary_records_this_checkout(tmp_path):
    r = subprocess.run([LQ, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"(git {recorded(ROOT, tmp_path / 'commit.h')})" in r.stdout, r.stdout
