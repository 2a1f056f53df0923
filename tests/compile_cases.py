"""What the tests of the compile report and its readers share (tests/kernels/test_compile_report.py,
test_compile_tables.py, test_compile_predictions.py, test_tile_space.py): a launch as a comparable
key, and a hand-made compile record."""

import json

from mlsys.kernels.aot import Compiled, Launch


def launch_key(launch: Launch) -> str:
    return json.dumps(launch.as_dict(), sort_keys=True)


def fake_compiled(**kw) -> Compiled:
    launch = Launch("flash_attention.fwd", "bf16",
                    {"batch": 1, "heads": 1, "seq": 128, "head_dim": 64, "causal": False},
                    {"BLOCK_M": 64, "BLOCK_N": 32}, 4, 2, "sm_90")
    fields = {"registers": 128, "shared_bytes": 24576, "opcodes": {"HGMMA": 6}, **kw}
    return Compiled(launch=launch, **fields)
