"""SIGINT and SIGTERM end a command with one line (exit 128 + the signal), after its clean-up: the
doctor's temporary directory, with the stack's private key in it, is gone on every way out.

Each run is a child process whose fake cluster signals its own process while the doctor waits on
it (no sleeps, and the test's own process is never signalled). Before issue 31, SIGTERM left the
key on disk and Ctrl-C printed a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli import doctor, guard

ROOT = Path(__file__).resolve().parents[2]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from cli import doctor
    from cli.guard import run_guarded

    how = sys.argv[1]

    class Signalled:
        \"\"\"A cluster whose first answer (the nodes: doctor's first check) is the signal, or a bug.\"\"\"

        def nodes(self):
            keys = list(Path(os.environ["TMPDIR"]).glob("testbed-doctor-*/id_testbed"))
            print(f"key on disk: {len(keys)}, mode {oct(keys[0].stat().st_mode & 0o777)}", flush=True)
            if how == "error":
                raise RuntimeError("a bug in a check")
            os.kill(os.getpid(), getattr(signal, how))
            raise AssertionError("the signal did not end the command")

    doctor.read_outputs = lambda stack: {"controlPlanePublicIp": "198.51.100.10", "sshPrivateKey": sys.argv[2]}
    sys.exit(run_guarded(lambda: doctor.main([], kube=Signalled()), Path.cwd()))
    """
)


def _sigint_as_at_a_terminal() -> None:
    """A shell starts a background job with SIGINT ignored (POSIX "Signals and Error Handling"),
    and Python keeps an ignored SIGINT ignored: a suite run that way would signal a child deaf to
    it. Ctrl-C at a terminal reaches a command whose SIGINT is not ignored; the child starts so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    "how, code, line",
    [
        ("SIGINT", 130, "testbed: stopped by SIGINT; what the command had begun was cleaned up"),
        ("SIGTERM", 143, "testbed: stopped by SIGTERM; what the command had begun was cleaned up"),
        ("error", 1, "RuntimeError: a bug in a check"),
    ],
)
def test_a_signal_ends_doctor_in_one_line_and_its_key_is_gone(how, code, line, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how, KEY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_sigint_as_at_a_terminal,
    )
    assert done.stdout == "key on disk: 1, mode 0o600\n", done
    assert done.returncode == code, done
    if how == "error":  # a bug keeps its traceback; the key goes all the same
        assert done.stderr.strip().endswith(line), done.stderr
    else:
        assert done.stderr == line + "\n", done.stderr
    assert list(tmp_path.iterdir()) == [], "the temporary directory, key included, was left behind"


def test_the_key_is_created_readable_by_its_owner_only(tmp_path):
    """Created with mode 0600 (os.open), under any umask, and never written over."""
    old = os.umask(0)
    try:
        key = doctor.write_key(tmp_path, KEY)
    finally:
        os.umask(old)
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_text() == KEY
    with pytest.raises(FileExistsError):  # never written over (O_EXCL)
        doctor.write_key(tmp_path, KEY)


def test_the_guard_restores_the_sigterm_handler_it_replaced():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    seen = []
    assert guard.run_guarded(lambda: seen.append(signal.getsignal(signal.SIGTERM)) or 0, ROOT) == 0
    assert seen == [guard._terminate] and signal.getsignal(signal.SIGTERM) is before
