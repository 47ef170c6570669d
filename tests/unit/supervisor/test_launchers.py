"""Each launcher parsed as the launcher itself parses it: option tables against their own
argparse definitions, the same split of real command lines, world size and node rank from
their flags, config files and variables, and the options dssup adds per attempt."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dssup.errors import ConfigError
from dssup.supervisor.command import parse_command
from dssup.supervisor.launchers.accelerate import TABLE as ACCELERATE_TABLE
from dssup.supervisor.launchers.deepspeed import TABLE as DEEPSPEED_TABLE


def _real_table(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    values, flags = set(), set()
    for action in parser._actions:
        (flags if action.nargs == 0 else values).update(action.option_strings)
    return values, flags


def _ours(table) -> tuple[set[str], set[str]]:
    values = {s for s, n in table.canon.items() if n in table.takes_value}
    return values, set(table.canon) - values


@pytest.mark.torch
def test_accelerate_table_equals_accelerates_own_parser():
    launch = pytest.importorskip("accelerate.commands.launch")
    parser = launch.launch_command_parser()
    assert _ours(ACCELERATE_TABLE) == _real_table(parser)
    assert parser.allow_abbrev is ACCELERATE_TABLE.abbrev is False


@pytest.mark.deepspeed
def test_deepspeed_table_equals_the_runners_own_parser(monkeypatch):
    runner = pytest.importorskip("deepspeed.launcher.runner")
    seen = {}
    real_parse = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        seen["parser"] = self
        return real_parse(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    runner.parse_args(["train.py"])
    assert _ours(DEEPSPEED_TABLE) == _real_table(seen["parser"])
    assert seen["parser"].allow_abbrev is DEEPSPEED_TABLE.abbrev is True


ACCELERATE_ARGV = [
    "accelerate", "launch", "--multi_gpu", "--num_processes", "4", "--num-machines=2",
    "--machine_rank", "1", "--mixed_precision", "bf16", "train.py", "--lr", "3",
    "--num_processes", "9",
]  # fmt: skip


@pytest.mark.torch
def test_accelerate_split_matches_accelerate(monkeypatch):
    launch = pytest.importorskip("accelerate.commands.launch")
    real = launch.launch_command_parser().parse_args(ACCELERATE_ARGV[2:])
    cmd = parse_command(ACCELERATE_ARGV, env={})
    assert (cmd.script, cmd.script_args) == (real.training_script, real.training_script_args)
    assert cmd.options["num_processes"] == str(real.num_processes) == "4"
    world = cmd.world()
    assert (world.world_size, world.nnodes, world.nproc_per_node, world.node_rank) == (4, 2, 2, 1)


@pytest.mark.deepspeed
def test_deepspeed_split_matches_the_runner():
    runner = pytest.importorskip("deepspeed.launcher.runner")
    argv = ["deepspeed", "--num_gpus", "2", "--master_port", "29600", "train.py", "--deepspeed",
            "ds.json", "--num_gpus", "8"]  # fmt: skip
    real = runner.parse_args(argv[1:])
    cmd = parse_command(argv, env={})
    assert (cmd.script, cmd.script_args) == (real.user_script, real.user_args)
    assert cmd.world_size() == 2


def test_module_forms_and_single_process_accelerate(tmp_path):
    env = {"HF_HOME": str(tmp_path)}  # no accelerate config file there
    cmd = parse_command(["python3", "-m", "accelerate.commands.launch", "--multi_gpu",
                         "--num_processes", "2", "t.py"], env=env)  # fmt: skip
    assert cmd.name == "accelerate" and cmd.prefix == ["python3", "-m", _MODULE]
    one = parse_command(["accelerate", "launch", "t.py"], env=env)
    assert one.world_size() == 1  # accelerate's simple launcher: one process, no torchrun
    assert one.launcher.extras(one, tmp_path) == []
    assert one.launcher.log_dir(one, tmp_path) is None
    ds = parse_command(["python", "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "t.py"],
                       env={})  # fmt: skip
    assert ds.name == "deepspeed" and ds.world_size() == 2


_MODULE = "accelerate.commands.launch"


def test_accelerate_reads_its_config_file(tmp_path):
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "default_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 8\n"
        "num_machines: 2\nmachine_rank: 1\n"
    )
    cmd = parse_command(["accelerate", "launch", "t.py"], env={"HF_HOME": str(tmp_path)})
    world = cmd.world()
    assert (world.world_size, world.nproc_per_node, world.node_rank) == (8, 4, 1)
    assert "default_config.yaml" in world.source
    flags = parse_command(["accelerate", "launch", "--num_processes", "2", "t.py"],
                          env={"HF_HOME": str(tmp_path)})  # fmt: skip
    assert flags.world_size() == 2  # a flag beats the config file, as in accelerate


def test_dssup_adds_per_rank_logs_and_no_restarts(tmp_path):
    acc = parse_command(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "t.py"],
                        env={"HF_HOME": str(tmp_path)})  # fmt: skip
    assert acc.launcher.extras(acc, tmp_path) == [
        "--log_dir", str(tmp_path / "logs"), "--tee", "3", "--max_restarts", "0",
    ]  # fmt: skip
    mine = parse_command(["accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                          "--max_restarts", "1", "--tee", "1", "t.py"], env={})  # fmt: skip
    assert mine.launcher.extras(mine, tmp_path) == ["--log_dir", str(tmp_path / "logs")]
    ds = parse_command(["deepspeed", "--num_gpus", "2", "t.py"], env={})
    assert ds.launcher.extras(ds, tmp_path) == ["--enable_each_rank_log", str(tmp_path / "logs")]
    assert ds.launcher.echo_rank_logs and not acc.launcher.echo_rank_logs


def test_deepspeed_world_size_sources_and_refusals(tmp_path):
    inc = parse_command(["deepspeed", "--include", "localhost:0,1,2", "t.py"], env={})
    assert inc.world_size() == 3
    visible = parse_command(["deepspeed", "t.py"], env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert visible.world_size() == 2
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=8\nworker-1 slots=8\n")
    with pytest.raises(ConfigError, match="multi-node"):
        parse_command(["deepspeed", "-H", str(hostfile), "--num_gpus", "8", "t.py"], env={})
    with pytest.raises(ConfigError, match="multi-node"):
        parse_command(["deepspeed", "--num_nodes", "2", "--num_gpus", "8", "t.py"], env={})


def test_deepspeed_without_a_count_on_a_cpu_machine_is_refused(monkeypatch):
    monkeypatch.setattr("dssup.supervisor.launchers.deepspeed.gpu_count", lambda: 0)
    with pytest.raises(ConfigError, match="pass --num_gpus N"):
        parse_command(["deepspeed", "t.py"], env={})


def test_unknown_command_names_every_launcher():
    with pytest.raises(ConfigError) as err:
        parse_command(["python", "train.py"], env={})
    text = str(err.value)
    assert "not torchrun, accelerate launch or the deepspeed launcher" in text
    assert "accelerate launch --multi_gpu --num_processes N" in text
    assert "--command" not in text


def test_accelerate_does_not_abbreviate_so_worker_prefixes_pass():
    cmd = parse_command(["accelerate", "launch", "t.py", "--num", "3"], env={})
    assert cmd.script_args == ["--num", "3"]
    with pytest.raises(ConfigError, match="ambiguous prefix of deepspeed options"):
        parse_command(["deepspeed", "--num_gpus", "1", "t.py", "--no_", "3"], env={})


def test_torchrun_node_rank_from_flags_or_pet(tmp_path: Path):
    cmd = parse_command(["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "t.py"],
                        env={"PET_NODE_RANK": "1"})  # fmt: skip
    world = cmd.world()
    assert (world.world_size, world.node_rank) == (8, 1)
    flag = parse_command(["torchrun", "--nnodes", "2", "--node-rank", "0", "t.py"],
                         env={"PET_NODE_RANK": "1"})  # fmt: skip
    assert flag.world().node_rank == 0
