"""doctor and validate read the kubeconfig kubectl would: --kubeconfig, else $KUBECONFIG, else
the stack's kubeconfig output; problems name where the file came from."""

import os

import pytest

from cli import doctor
from cli import validate as validate
from core import user_files
from tests.conftest import write_kubeconfig


class Reached(Exception):
    pass


@pytest.fixture
def doctor_client(monkeypatch):
    """The kubeconfig doctor hands the kubernetes client; no cluster is called."""
    from validation import cluster

    seen = {}

    def refuse(config_dict, notice=None):
        seen["server"] = config_dict["clusters"][0]["cluster"]["server"]
        raise Reached

    monkeypatch.setattr(cluster, "api_client", refuse)
    monkeypatch.setattr(doctor, "read_outputs", lambda stack: "not deployed in the tests")
    return seen


def test_doctor_reads_kubeconfig_from_the_environment_and_the_flag_wins(tmp_path, monkeypatch, doctor_client):
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "env", "https://198.51.100.1:6443")))
    with pytest.raises(Reached):
        doctor.main([])
    assert doctor_client["server"] == "https://198.51.100.1:6443"
    with pytest.raises(Reached):
        doctor.main(["--kubeconfig", str(write_kubeconfig(tmp_path / "flag", "https://198.51.100.2:6443"))])
    assert doctor_client["server"] == "https://198.51.100.2:6443"


def test_doctor_names_kubeconfig_variable_in_its_problem(tmp_path, monkeypatch, capsys, doctor_client):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert doctor.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith('$KUBECONFIG: "') and err.endswith('" is not a file\n') and err.count("\n") == 1
    monkeypatch.delenv("KUBECONFIG")
    assert doctor.main([]) == 2
    assert "--kubeconfig and $KUBECONFIG not given" in capsys.readouterr().err


def test_validate_reads_kubeconfig_from_the_environment(tmp_path, monkeypatch, capsys):
    seen = {}

    def client_for(config, names):
        seen["server"] = config["clusters"][0]["cluster"]["server"]
        raise validate.UsageError("stopped before the cluster")

    monkeypatch.setattr(validate, "client_for", client_for)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "env", "https://198.51.100.3:6443")))
    assert validate.main(["--scenario", "mixed", "--out", str(tmp_path / "o")]) == 2
    assert seen["server"] == "https://198.51.100.3:6443"
    assert capsys.readouterr().err == "validate: stopped before the cluster\n"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert validate.main(["--scenario", "mixed", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith('validate: $KUBECONFIG: "') and err.endswith('" is not a file\n') and err.count("\n") == 1


def test_a_kubeconfig_list_is_refused_rather_than_half_read(tmp_path):
    listed = os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(user_files.UserFileError, match="lists 2 files, which kubectl merges"):
        user_files.kubeconfig_file(None, {"KUBECONFIG": listed})
    assert user_files.kubeconfig_file(None, {"KUBECONFIG": ""}) is None
    assert user_files.kubeconfig_file(tmp_path / "f", {"KUBECONFIG": listed}) == ("--kubeconfig", tmp_path / "f")


def test_validate_without_a_kubeconfig_asks_pulumi_for_the_named_stack_in_the_project(tmp_path, monkeypatch):
    """From any directory (the `testbed` command), for the --stack given, not the selected one."""
    stub = tmp_path / "bin" / "pulumi"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "$PWD $*" > "$STUB_LOG"\nexit 1\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(tmp_path / "called"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(validate.UsageError, match="--kubeconfig and \\$KUBECONFIG not given"):
        validate.load_kubeconfig(None, "prod")
    where, *words = (tmp_path / "called").read_text().split()
    assert where == str(validate.offline.ROOT)
    assert words == ["stack", "output", "--show-secrets", "--stack", "prod", "kubeconfig"]
