"""torchrun command parsing and rewriting, without torch in the supervisor."""

import pytest

from dssup.errors import ConfigError
from dssup.supervisor.command import TORCHRUN_FLAGS, TORCHRUN_OPTIONS, parse_command


def test_split_launcher_and_worker_args():
    c = parse_command(
        [
            "torchrun",
            "--standalone",
            "--nproc-per-node=4",
            "--nnodes",
            "2",
            "train.py",
            "--lr",
            "3",
            "--nnodes",
            "9",
        ],
        env={},
    )
    assert c.script == "train.py"
    assert c.script_args == ["--lr", "3", "--nnodes", "9"]
    assert c.options == {"standalone": None, "nproc-per-node": "4", "nnodes": "2"}
    assert c.world_size() == 8


def test_python_m_form_and_underscore_spelling():
    c = parse_command(
        ["python3", "-m", "torch.distributed.run", "--nproc_per_node", "3", "t.py"], env={}
    )
    assert c.prefix == ["python3", "-m", "torch.distributed.run"]
    assert c.world_size() == 3


def test_pet_environment_is_honoured_and_flags_win():
    env = {"PET_NNODES": "1:4", "PET_NPROC_PER_NODE": "8"}
    assert parse_command(["torchrun", "t.py"], env=env).world_size() == 32
    assert parse_command(["torchrun", "--nproc-per-node", "2", "t.py"], env=env).world_size() == 8


def test_argv_inserts_dssup_options_before_the_script():
    c = parse_command(["torchrun", "--standalone", "t.py", "--a", "1"], env={})
    assert c.argv(["--log-dir", "L"], ["--a", "2"]) == [
        "torchrun",
        "--standalone",
        "--log-dir",
        "L",
        "t.py",
        "--a",
        "2",
    ]


@pytest.mark.parametrize("bad", ["--mon", "--nproc", "--rdzv", "--max", "--d"])
def test_ambiguous_worker_prefix_is_refused(bad):
    with pytest.raises(ConfigError, match="ambiguous prefix"):
        parse_command(["torchrun", "t.py", bad, "3"], env={})


@pytest.mark.parametrize("ok", ["--model-dim", "--monitor-interval", "--lr", "--nnodes", "--x"])
def test_unambiguous_worker_args_pass(ok):
    assert parse_command(["torchrun", "t.py", ok, "3"], env={}).script_args == [ok, "3"]


def test_not_torchrun_and_no_script():
    with pytest.raises(ConfigError, match="not torchrun"):
        parse_command(["python", "train.py"], env={})
    with pytest.raises(ConfigError, match="no training script"):
        parse_command(["torchrun", "--standalone"], env={})
    with pytest.raises(ConfigError, match="unknown torchrun option"):
        parse_command(["torchrun", "--nprocs", "2", "t.py"], env={})


@pytest.mark.torch
def test_option_table_equals_torchruns_own_parser():
    run = pytest.importorskip("torch.distributed.run")
    real = {o for a in run.get_args_parser()._actions for o in a.option_strings}
    assert real == set(TORCHRUN_OPTIONS | TORCHRUN_FLAGS)
