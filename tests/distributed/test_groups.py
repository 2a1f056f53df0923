"""mlsys.distributed.groups: the argument checks every strategy shares, each a clear error; and no
function of mlsys.distributed or mlsys.train falls back to a default process group."""

import importlib
import inspect
import pkgutil

import pytest
import torch.distributed as dist
from torch import nn

import mlsys.distributed
import mlsys.train
from mlsys.distributed import comms, cp, ddp, fsdp, mesh, pp, torch_strategies, tp, zero
from mlsys.distributed.groups import check_blocks, check_group, check_initialized
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_group_is_required_and_must_be_initialized(one_rank):
    assert check_group(one_rank) is one_rank
    check_initialized()
    with pytest.raises(TypeError, match="stage.group must be a torch.distributed.ProcessGroup"):
        check_group(None, "stage.group")


def test_no_process_group_is_a_clear_error():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        check_group(None)
    with pytest.raises(RuntimeError, match="not initialized"):
        check_initialized()


def test_what_is_not_a_group_is_named_even_outside_a_launch():
    assert not dist.is_initialized()
    with pytest.raises(TypeError, match=r"^group must be a torch.distributed.ProcessGroup \(e.g. "
                                        r"Rank.group or a mesh axis\), got str 'world'$"):
        check_group("world")
    with pytest.raises(TypeError, match=r"pp_group must be .* got list \[0, 1, 2, 3, 4, 5, 6, 7, "
                                        r"8, 9, 10, 11\.\.\.$"):
        check_group(list(range(100)), "pp_group")


def test_blocks_are_required():
    model = Transformer(TransformerConfig())
    assert check_blocks(model) is model
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_blocks("model")
    with pytest.raises(TypeError, match="`.blocks`"):
        check_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_every_strategy_uses_the_shared_checks():
    for module in (comms, cp, ddp, fsdp, pp, torch_strategies, tp, zero):
        assert module.check_group is check_group, module.__name__
    for module in (cp, tp, torch_strategies):
        assert module.check_blocks is check_blocks, module.__name__
    assert mesh.check_initialized is check_initialized


def _modules(package):
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def test_no_function_defaults_its_process_group():
    """A group is an explicit argument: `group` and `pp_group` have no default anywhere (None
    where allowed means no group, never WORLD; `replicate_group=None` means no HSDP)."""
    defaulted = []
    for package in (mlsys.distributed, mlsys.train):
        for module in _modules(package):
            for obj in vars(module).values():
                if getattr(obj, "__module__", None) != module.__name__:
                    continue
                functions = [obj] if inspect.isfunction(obj) else (
                    [f for f in vars(obj).values() if inspect.isfunction(f)]
                    if inspect.isclass(obj) else [])
                for function in functions:
                    for param in inspect.signature(function).parameters.values():
                        if param.name in ("group", "pp_group") and \
                                param.default is not inspect.Parameter.empty:
                            defaulted.append(f"{module.__name__}.{function.__qualname__}")
    assert defaulted == []
