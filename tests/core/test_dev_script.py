"""``./dev`` on a fresh machine: a distribution's own Python, no uv, no pip --user.

Each test copies ``dev`` into an empty "checkout" of its own (so that what it installs lands under the
test's ``.factstream/tools``, not this checkout's), with a temporary ``HOME`` and a ``PATH`` that is a
directory of links to the system's programs, less ``uv`` and whatever else the test takes away, and a
``python3`` of the test's choosing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_BIN = [Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin")]
#: Kept from the test's environment: how pip and uv reach their indexes.
KEPT = {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE", "LANG"}
#: This test's Python, as on Debian without python3-venv: ``python3 -m venv`` fails.
NO_VENV_PYTHON = (
    "#!/bin/sh\n"
    'case "$*" in *"-m venv"*) echo "ensurepip is not available" >&2; exit 1;; esac\n'
    f'exec {sys.executable} "$@"\n'
)


def externally_managed_python() -> Path:
    """A distribution's Python (one with PEP 668's EXTERNALLY-MANAGED marker) that has venv, or skip."""
    for marker in sorted(Path("/usr/lib").glob("python3.*/EXTERNALLY-MANAGED"), reverse=True):
        python = Path("/usr/bin") / marker.parent.name
        if not python.is_file():
            continue
        version = subprocess.run([python, "--version"], capture_output=True, text=True).stdout.split()[-1]
        if tuple(int(part) for part in version.split(".")[:2]) < (3, 11):
            continue
        if subprocess.run([python, "-c", "import ensurepip, venv"], capture_output=True).returncode != 0:
            pytest.skip(f"{python} has no venv (Debian: apt-get install python3-venv; .ci/run does)")
        return python
    pytest.skip("no distribution Python 3.11+ with an EXTERNALLY-MANAGED marker (Debian: apt-get install python3)")


def checkout(tmp_path: Path) -> Path:
    """An empty checkout holding only ``dev``."""
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy2(ROOT / "dev", root / "dev")
    return root


def sandbox(tmp_path: Path, python: Path | str | None, without: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a run: PATH is one directory of links to the system's programs, less ``uv``,
    ``uvx``, every ``python*`` and ``without``; ``python3`` is ``python`` (a path, or a script's text)."""
    bin_dir = tmp_path / "sandbox-bin"
    bin_dir.mkdir()
    left_out = {"uv", "uvx", *without}
    for directory in SYSTEM_BIN:
        if not directory.is_dir():
            continue
        for program in directory.iterdir():
            name = program.name
            if name in left_out or name.startswith("python") or (bin_dir / name).exists():
                continue
            if os.access(program, os.X_OK) and not program.is_dir():
                (bin_dir / name).symlink_to(program)
    if isinstance(python, Path):
        (bin_dir / "python3").symlink_to(python)
    elif isinstance(python, str):
        (bin_dir / "python3").write_text(python)
        (bin_dir / "python3").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k in KEPT or k.startswith("PIP_")}
    env.update(PATH=str(bin_dir), HOME=str(home), LC_ALL="C.UTF-8")
    return env


def dev(
    root: Path, env: dict[str, str], *args: str, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "dev"), *args], cwd=cwd or root, env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_clear_failure(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert all(line.startswith("dev: ") for line in done.stderr.splitlines()), done.stderr
    return done.stderr


@pytest.mark.slow
def test_a_distribution_python_gets_uv_in_a_private_environment(tmp_path):
    python = externally_managed_python()
    # The situation the script must cope with: pip refuses to install into this Python.
    refused = subprocess.run([python, "-m", "pip", "install", "--user", "uv"], capture_output=True, text=True)
    assert refused.returncode != 0
    root = checkout(tmp_path)
    env = sandbox(tmp_path, python)

    done = dev(root, env, "uv", "--version")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.fullmatch(r"uv \d+\.\d+\.\d+.*\n", done.stdout), done.stdout
    assert "installing uv privately" in done.stderr and "pip install uv" in done.stderr, done.stderr
    private = root / ".factstream" / "tools"
    assert (private / "bin" / "uv").resolve() == (private / "venv" / "bin" / "uv").resolve()
    assert (private / "venv" / "pyvenv.cfg").is_file()
    # Nothing went to the user's site-packages or ~/.local/bin.
    assert not (Path(env["HOME"]) / ".local").exists()

    # The next run finds the private uv and installs nothing.
    again = dev(root, env, "uv", "--version")
    assert again.returncode == 0 and again.stdout == done.stdout, again.stdout + again.stderr
    assert again.stderr == "", again.stderr


def test_without_venv_uvs_installer_is_used_and_a_half_made_venv_removed(tmp_path):
    """A venv without the link that marks it finished (an interrupted install) is not used: ./dev tries venv
    again, which fails here, and then uv's official installer (a stand-in served by a fake curl)."""
    root = checkout(tmp_path)
    (root / ".factstream" / "tools" / "venv" / "bin").mkdir(parents=True)
    env = sandbox(tmp_path, NO_VENV_PYTHON, without=("curl", "wget"))
    calls, target = tmp_path / "curl-calls", tmp_path / "installed-into"
    # A stand-in for uv's installer: it honours UV_UNMANAGED_INSTALL as the real one does.
    installer = tmp_path / "install.sh"
    installer.write_text(
        f'printf "%s\\n" "$UV_UNMANAGED_INSTALL" > {target}\n'
        'mkdir -p "$UV_UNMANAGED_INSTALL"\n'
        "printf '#!/bin/sh\\necho uv 9.9.9-installed\\n' > \"$UV_UNMANAGED_INSTALL/uv\"\n"
        'chmod +x "$UV_UNMANAGED_INSTALL/uv"\n'
    )
    fake_curl = Path(env["PATH"]) / "curl"
    fake_curl.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncat {installer}\n')
    fake_curl.chmod(0o755)

    done = dev(root, env, "uv", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "uv 9.9.9-installed\n"
    assert "https://astral.sh/uv/install.sh" in calls.read_text()
    assert target.read_text().strip() == str(root / ".factstream" / "tools" / "bin")
    assert not (root / ".factstream" / "tools" / "venv").exists(), "the half-made venv is left behind"
    assert "does not work here" in done.stderr and "official installer" in done.stderr, done.stderr


def test_without_venv_curl_or_wget_it_says_what_to_install(tmp_path):
    root = checkout(tmp_path)
    env = sandbox(tmp_path, NO_VENV_PYTHON, without=("curl", "wget"))
    stderr = assert_clear_failure(dev(root, env, "demo"))
    assert "sudo apt install python3-venv" in stderr, stderr
    assert "https://docs.astral.sh/uv/getting-started/installation/" in stderr, stderr
    assert "ensurepip is not available" in (root / ".factstream" / "tools" / "venv.log").read_text()
    assert not (root / ".factstream" / "tools" / "bin" / "uv").exists()
    assert not (root / ".venv").exists()


@pytest.mark.parametrize(
    ("python", "message"),
    [
        ("#!/bin/sh\necho 'Python 3.8.10'\n", r"needs Python 3\.11 or later; \S+/python3 is 3\.8\.10"),
        ("#!/bin/sh\necho 'Python 3.10.12'\n", r"needs Python 3\.11 or later; \S+/python3 is 3\.10\.12"),
        ("#!/bin/sh\necho 'Python 2.7.18' >&2\n", r"needs Python 3\.11 or later; \S+/python3 is 2\.7\.18"),
        ("#!/bin/sh\nexit 127\n", r"could not tell which Python \S+/python3 is"),
        (None, r"needs Python 3\.11 or later, and there is no python3 on PATH"),
    ],
    ids=["3.8", "3.10", "python2", "broken", "none"],
)
def test_a_python_too_old_or_missing_is_named_before_anything_is_installed(tmp_path, python, message):
    root = checkout(tmp_path)
    env = sandbox(tmp_path, python)
    for command in ("demo", "uv"):
        stderr = assert_clear_failure(dev(root, env, command, "--version"))
        assert re.search(message, stderr), stderr
        assert "PYTHON=/path/to/python3.12 ./dev" in stderr, stderr
    assert not (root / ".factstream").exists()


def test_python_names_the_interpreter_to_use_and_dev_uv_runs_where_it_is_called(tmp_path):
    root = checkout(tmp_path)
    env = sandbox(tmp_path, "#!/bin/sh\necho 'Python 3.8.10'\n")
    # A good Python named by PYTHON wins over an old python3; the check then passes and uv is looked for.
    env["PYTHON"] = sys.executable
    Path(env["HOME"], ".local", "bin").mkdir(parents=True)
    uv = Path(env["HOME"], ".local", "bin", "uv")
    uv.write_text('#!/bin/sh\necho "uv 1.2.3-home in $PWD"\n')
    uv.chmod(0o755)
    elsewhere = tmp_path / "plugin"
    elsewhere.mkdir()
    done = dev(root, env, "uv", "--version", cwd=elsewhere)
    assert done.returncode == 0 and done.stdout == f"uv 1.2.3-home in {elsewhere}\n", done.stdout + done.stderr


def test_a_uv_off_path_is_named_with_how_to_put_it_on_path_once(tmp_path):
    """uv in ~/.local/bin with that directory not on PATH: ./dev uses it, and says (once) how to get the
    docs' uv commands working in the user's shell; a uv on PATH gets no such line."""
    root = checkout(tmp_path)
    env = sandbox(tmp_path, Path(sys.executable))
    local_bin = Path(env["HOME"], ".local", "bin")
    local_bin.mkdir(parents=True)
    (local_bin / "uv").write_text('#!/bin/sh\necho "uv 1.2.3"\n')
    (local_bin / "uv").chmod(0o755)

    first = dev(root, env, "uv", "--version")
    assert first.returncode == 0 and first.stdout == "uv 1.2.3\n", first.stdout + first.stderr
    assert f"uv is {local_bin / 'uv'}, which is not on your PATH" in first.stderr, first.stderr
    assert f'export PATH="{local_bin}:$PATH"' in first.stderr, first.stderr
    assert dev(root, env, "uv", "--version").stderr == ""  # said once

    on_path = dev(root, {**env, "PATH": f"{local_bin}{os.pathsep}{env['PATH']}"}, "uv", "--version")
    assert on_path.returncode == 0 and on_path.stderr == "", on_path.stderr


def test_usage_lists_every_command():
    done = subprocess.run([str(ROOT / "dev"), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    for command in ("demo", "test", "docs", "bootstrap", "uv"):
        assert re.search(rf"^  {command} ", done.stdout, re.MULTILINE), done.stdout
    wrong = subprocess.run([str(ROOT / "dev"), "nonsense"], capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and "usage: ./dev" in wrong.stderr


@pytest.mark.slow
def test_the_sync_step_keeps_a_plugin_installed_by_hand(tmp_path):
    """docs/tutorial.md installs its plugin into ./dev's environment; the next ./dev must not remove it."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT", "FACTSTREAM_"))}
    # ./dev's environment, here a new one instead of the checkout's .venv.
    env.update(UV_PROJECT_ENVIRONMENT=str(venv), COLUMNS="200")
    first = dev(ROOT, env, "bootstrap", timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "about 830 MB to download the first time" in first.stderr, first.stderr
    assert f". {venv}/bin/activate" in first.stderr, first.stderr

    # The tutorial's steps 1 and 3, in the activated environment.
    active = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}
    for args in (
        ["factstream", "new-stream", "likes", "--description", "who likes what"],
        ["uv", "pip", "install", "-e", "factstream-likes"],
    ):
        done = subprocess.run(args, cwd=tmp_path, env=active, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr

    again = dev(ROOT, env, "bootstrap", timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "830 MB" not in again.stderr, again.stderr
    still = subprocess.run(
        [venv / "bin" / "python", "-c", "import factstream_likes; print(factstream_likes.__file__)"],
        capture_output=True,
        text=True,
    )
    assert still.returncode == 0, f"./dev's uv sync removed the tutorial's plugin:\n{still.stderr}"
    assert still.stdout.startswith(str(tmp_path / "factstream-likes")), still.stdout
    # The workspace's own plugins are all there too.
    listed = subprocess.run(["factstream", "plugins"], env=active, capture_output=True, text=True, timeout=120)
    for name in ("likes", "events", "receipts", "typing", "presence", "to_device", "account_data", "caches"):
        assert f" {name} " in listed.stdout, listed.stdout


def test_a_failed_first_install_says_what_it_was_doing_and_what_to_do(tmp_path):
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed")
    root = checkout(tmp_path)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "checkout"\nversion = "0"\nrequires-python = ">=3.11"\n'
        'dependencies = ["factstream-no-such-distribution-zz"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT", "FACTSTREAM_"))}
    env["UV_OFFLINE"] = "1"  # the resolution fails without asking an index
    done = dev(root, env, "bootstrap")
    assert done.returncode != 0, done.stderr
    assert "dev: about 830 MB to download the first time" in done.stderr, done.stderr
    assert "factstream-no-such-distribution-zz" in done.stderr, "uv's own message is not shown"
    assert "dev: uv sync failed" in done.stderr and "pypi.org can be reached" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (root / ".venv" / ".factstream-dev-synced").exists()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["while Spark starts", "while tests use Spark"])
def test_one_ctrl_c_stops_dev_test(tmp_path, moment):
    """Ctrl-C (SIGINT to the foreground process group, as a terminal sends it) while a test's Spark session
    starts, or once tests run on it: ./dev test stops at once, cleanly (no traceback, no later stage), and
    leaves nothing running.

    The staged run is narrowed to the Spark data source's tests through ``PYTEST_ADDOPTS``, which pytest
    adds to every stage's arguments: stage 1 selects none of them, stage 2 starts Spark."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FACTSTREAM_PORTS"))}
    env.update(PYTEST_ADDOPTS=f"-p no:cacheprovider --basetemp={tmp_path / 'run'} tests/export/test_datasource.py")
    proc = subprocess.Popen(
        [str(ROOT / "dev"), "test"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()

    def ready() -> bool:
        if moment == "while Spark starts":
            return any("spark" in _command(p).lower() for p in seen.values())
        stage_2 = "".join(chunks).partition("dev: stage 2 of 3")[2]
        return bool(re.search(r"items\]\n\n?[.F]", stage_2))

    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 300
        while not ready():
            assert proc.poll() is None, "".join(chunks)
            assert time.monotonic() < deadline, f"not {moment} within 300 s:\n{''.join(chunks)}"
            for p in _tree(proc.pid):
                seen.setdefault(p.pid, p)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        interrupted = time.monotonic()
        proc.wait(timeout=120)
        took = time.monotonic() - interrupted
        reader.join(10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(chunks)
    assert proc.returncode == 130, output
    assert "dev: interrupted in stage 2 of 3: the stages after it did not run" in output, output
    assert "stage 3 of 3" not in output, output
    assert "Traceback" not in output and "KeyError" not in output, output
    assert took < 60, f"the run took {took:.0f} s to stop after Ctrl-C:\n{output}"
    left = psutil.wait_procs([p for p in seen.values() if p.pid != proc.pid], timeout=15)[1]
    assert not left, [_command(p)[:200] for p in left]
