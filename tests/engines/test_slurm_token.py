"""Who may ask the real slurmctld 26.05.5 for a JWT (`scontrol token`), booted from the program's
slurm.conf: AuthAltParameters given twice, the operator's `jwt_key=` line and then the program's with
disable_token_creation (components/slinky.py _auth_alt_parameters).

Debian's Slurm has no auth/jwt (harness ADAPTATIONS), so no token is minted here. But slurmctld
checks disable_token_creation before it asks for the plugin (SchedMD/slurm@slurm-26-05-0-1 and
@slurm-25-11-6-1: src/slurmctld/proc_req.c _slurm_rpc_auth_token): a user it refuses gets
"Access/permission denied", a user it lets through gets the missing plugin's error, which on the
cluster would be a token. So the engine shows which value is in effect and whom it refuses; only a
cluster with auth/jwt shows the token itself (docs/real-engines.md).
"""

from __future__ import annotations

import re

import pytest

from cli import doctor
from components import slinky, slurm_config
from core.names import slurm_names
from stacks import offline
from tests.engines import harness
from tests.engines.conftest import engine_marks, worker_index

pytestmark = engine_marks(__name__)
NOBODY = "65534"  # the exporter's token user (Debian's nobody): neither root nor SlurmUser
REFUSED = "Access/permission denied"  # ESLURM_ACCESS_DENIED: disable_token_creation's answer
LET_THROUGH = "Required plugin type not loaded"  # ESLURM_PLUGIN_NOT_LOADED: past that check, no auth/jwt here
# A year: what someone holding the exporter's 15-minute token would ask for.
LIFESPAN = f"lifespan={365 * 24 * 3600}"


def operator_only(values: dict) -> dict:
    """The chart values without the program's AuthAltParameters: the operator's slurm.conf alone."""
    conf = {k: v for k, v in values["controller"]["extraConfMap"].items() if k != "AuthAltParameters"}
    return {**values, "controller": {**values["controller"], "extraConfMap": conf}}


def doctor_check(slurm: harness.Engines) -> doctor.Check:
    """`doctor`'s slurm-tokens check, its `scontrol show config` run in this slurmctld."""

    class Kube:
        def exec(self, namespace: str, pod: str, container: str, command: list[str]) -> tuple[int, str]:
            done = slurm.client(*command)
            return done.returncode, done.stdout + done.stderr

    d = doctor.Doctor(offline.stack_settings("dev", []), Kube(), None)  # type: ignore[arg-type]
    d.token_creation()
    (check,) = d.checks
    return check


def ask_for_token(slurm: harness.Engines, uid: str, *args: str) -> str:
    """`scontrol token ARGS` run as `uid` in the controller: its error line (it never succeeds here)."""
    done = slurm.client("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "scontrol", "token", *args)
    assert done.returncode != 0, done.stdout  # no auth/jwt here: a token would mean the test is wrong
    return done.stderr


@pytest.mark.parametrize("program", [True, False], ids=["program-slurm-conf", "operator-slurm-conf"])
def test_only_root_and_slurmuser_may_ask_for_a_token(engine_root, tmp_path, deployed_slurm_values, program):
    values = deployed_slurm_values if program else operator_only(deployed_slurm_values)
    names = slurm_names("slinky")
    with harness.engines(tmp_path, values, names, worker_index()) as slurm:
        shown = slurm.client("scontrol", "show", "config").stdout
        in_effect = dict(re.findall(r"^(\w+)\s+= (.*)$", shown, flags=re.M))
        rendered = slurm_config.slurm_conf(values, names)
        assert in_effect["AuthAltParameters"] == slurm_config.global_setting(rendered, "AuthAltParameters", "")
        log = (tmp_path / "log" / "slurmctld.log").read_text()
        if program:  # parse_config.c _handle_common: the second line replaces the first
            assert "AuthAltParameters 1 specified more than once, latest value used" in log
            assert in_effect["AuthAltParameters"].endswith("," + slinky.DISABLE_TOKEN_CREATION)
        else:
            assert in_effect["AuthAltParameters"] == slurm_config.OPERATOR_AUTH_ALT_PARAMETERS
        assert doctor_check(slurm).status == (doctor.OK if program else doctor.FAIL)
        # nobody, for itself, a year: refused with the program's slurm.conf, let through without it.
        assert (REFUSED if program else LET_THROUGH) in ask_for_token(slurm, NOBODY, LIFESPAN)
        # root and SlurmUser are exempt (validate_slurm_user), also asking for another user's token.
        for uid in ("0", harness.SLURM_UID_IN_ROOT):
            assert LET_THROUGH in ask_for_token(slurm, uid, LIFESPAN, "username=nobody")
