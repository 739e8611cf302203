"""The launcher's variables (config/launcher_env.py), checked by preflight before run_train.sh
computes with them or torchrun starts: each bad value is one ``config error:`` line naming the
variable, exit code 2 (tests/e2e/test_preflight.py runs a few through run_train.sh itself)."""

import contextlib
import io
import logging

import pytest

from torchtitan_like import preflight
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.launcher_env import LauncherEnv, read_launcher_env

MULTI = {"NNODES": "2", "NODE_RANK": "1", "RDZV_ENDPOINT": "node0:29500"}

BAD = [
    ({"NPROC": "0"}, "NPROC=0: processes on this node must be a whole number >= 1"),
    ({"NPROC": "-1"}, "NPROC=-1: processes on this node must be a whole number >= 1"),
    ({"NPROC": "two"}, "NPROC=two: processes on this node must be a whole number >= 1"),
    ({"NPROC": "08"}, "NPROC=08: processes on this node must be a whole number >= 1"),
    ({"NPROC": " 2"}, "NPROC= 2: processes on this node must be a whole number >= 1"),
    ({"NGPU": "0"}, "NGPU=0: processes on this node must be a whole number >= 1"),
    ({"NNODES": "0"}, "NNODES=0: the number of nodes must be a whole number >= 1"),
    ({"NNODES": "1.5"}, "NNODES=1.5: the number of nodes must be a whole number >= 1"),
    ({**MULTI, "NODE_RANK": ""}, "NNODES=2 needs NODE_RANK, this node's index in 0..1"),
    ({**MULTI, "NODE_RANK": "2"}, "NODE_RANK=2: must be a node index in 0..1 (NNODES=2)"),
    ({**MULTI, "NODE_RANK": "-1"}, "NODE_RANK=-1: this node's index must be a whole number >= 0"),
    ({"NODE_RANK": "1"}, "NODE_RANK=1, but NNODES=1: set NNODES to the number of nodes"),
    ({**MULTI, "RDZV_ENDPOINT": ""}, "NNODES=2 needs RDZV_ENDPOINT=host:port, node 0's "
                                     "rendezvous (the same on every node)"),
    *(({**MULTI, "RDZV_ENDPOINT": bad}, f"RDZV_ENDPOINT={bad}: expected host:port of node 0's "
                                        "rendezvous, e.g. node0:29500 (port 1..65535)")
      for bad in ("node0", "node0:", ":29500", "node0:0", "node0:65536", "node0:http")),
    ({"MAX_RESTARTS": "-1"}, "MAX_RESTARTS=-1: restarts after a failure must be a whole "
                             "number >= 0"),
    ({"MAX_RESTARTS": "many"}, "MAX_RESTARTS=many: restarts after a failure must be a whole "
                               "number >= 0"),
    *(({"NPROC": "2", "LOG_RANK": bad}, f"LOG_RANK={bad}: expected local ranks of this node, "
                                        "comma-separated, each in 0..1 (NPROC=2)")
      for bad in ("2", "-1", "0,", "all", "0 1")),
]


@pytest.mark.parametrize("environ, line", BAD, ids=[" ".join(f"{k}={v}" for k, v in e.items())
                                                    for e, _ in BAD])
def test_each_bad_launcher_variable_is_one_line_naming_it(environ, line):
    with pytest.raises(ConfigError) as error:
        read_launcher_env(environ)
    assert str(error.value) == line


def test_good_values_and_what_they_mean():
    assert read_launcher_env({}) == LauncherEnv()  # run_train.sh's defaults
    assert read_launcher_env({"NPROC": "", "NNODES": "", "LOG_RANK": ""}) == LauncherEnv()
    env = read_launcher_env({"NGPU": "8", **MULTI, "MAX_RESTARTS": "3", "LOG_RANK": "0,7"})
    assert (env.nproc, env.nnodes, env.world_size, env.node_rank, env.max_restarts,
            env.log_ranks, env.unused) == (8, 2, 16, 1, 3, (0, 7), ())
    assert read_launcher_env({"NPROC": "2", "NGPU": "0"}).nproc == 2  # NPROC wins, as in bash
    assert read_launcher_env({**MULTI, "RDZV_ENDPOINT": "[fe80::1]:29500"}).rdzv_endpoint
    one_node = read_launcher_env({"NODE_RANK": "0", "RDZV_ENDPOINT": "h:1", "RDZV_ID": "x"})
    assert one_node.unused == ("RDZV_ENDPOINT", "RDZV_ID")


def test_several_bad_variables_are_reported_together():
    with pytest.raises(ConfigError, match=r"^2 problems:\n  NPROC=0: .*\n  NNODES=x: "):
        read_launcher_env({"NPROC": "0", "NNODES": "x"})


def run_preflight(monkeypatch, environ: dict[str, str], argv: list[str]) -> tuple[int, str]:
    for name in ("NPROC", "NGPU", "NNODES", "NODE_RANK", "RDZV_ENDPOINT", "RDZV_ID",
                 "MAX_RESTARTS", "LOG_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    logger = logging.getLogger("torchtitan_like")
    saved = logger.handlers[:], logger.propagate, logger.level
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out):
            code = preflight.main(argv)
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])
    return code, out.getvalue()


def test_preflight_refuses_a_bad_variable_in_one_line_and_checks_the_config_at_its_size(
        monkeypatch, tmp_path):
    code, said = run_preflight(monkeypatch, {"NPROC": "0"}, [f"--job.dump_folder={tmp_path}"])
    assert code == 2 and said.strip().endswith("config error: NPROC=0: processes on this "
                                               "node must be a whole number >= 1"), said
    assert len(said.strip().splitlines()) == 1
    argv = [f"--job.dump_folder={tmp_path}", "--parallelism.data_parallel_shard_degree=3"]
    code, said = run_preflight(monkeypatch, {"NPROC": "2", "NNODES": "2", "NODE_RANK": "0",
                                             "RDZV_ENDPOINT": "h:1"}, argv)
    assert code == 2 and "= 3, but 4 processes run" in said, said


def test_one_node_names_the_rendezvous_variables_it_does_not_read(monkeypatch, tmp_path):
    code, said = run_preflight(monkeypatch, {"RDZV_ENDPOINT": "node0:29500"},
                               [f"--job.dump_folder={tmp_path}"])
    assert code == 0
    assert said.strip().endswith("RDZV_ENDPOINT set but unused: NNODES=1, the job's processes "
                                 "meet on this node"), said
