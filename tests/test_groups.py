"""mlsys.distributed.groups: the argument checks every strategy shares, each a clear error."""

import pytest
import torch.distributed as dist
from torch import nn

from mlsys.distributed import cp, fsdp, pp, tp
from mlsys.distributed.groups import check_blocks, check_group
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_group_is_required_and_must_be_initialized(one_rank):
    assert check_group(one_rank) is one_rank
    with pytest.raises(TypeError, match="stage.group must be a torch.distributed.ProcessGroup"):
        check_group(None, "stage.group")


def test_no_process_group_is_a_clear_error():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        check_group(object())


def test_blocks_are_required():
    model = Transformer(TransformerConfig())
    assert check_blocks(model) is model
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_blocks("model")
    with pytest.raises(TypeError, match="`.blocks`"):
        check_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_every_strategy_uses_the_shared_checks():
    for module in (cp, fsdp, pp, tp):
        assert module.check_group is check_group, module.__name__
    for module in (cp, tp):
        assert module.check_blocks is check_blocks, module.__name__
