"""Parallelization plans: the data model (:mod:`.core`) and the constructors of the baseline and
TAG strategies (:mod:`.constructors`)."""

from placement_rl.plan.constructors import (
    data_parallel,
    data_parallel_per_tensor,
    expert,
    layerwise,
    single_device,
    subset_data_parallel,
    tag_group_config,
    tag_strategy,
)
from placement_rl.plan.core import (
    PLAN_FORMAT,
    PLAN_SCHEMA_VERSION,
    SYNC_MODES,
    TAG_OPTIONS,
    OpConfig,
    Plan,
    SyncMode,
    TagOption,
    member_config,
)

__all__ = [
    "PLAN_FORMAT",
    "PLAN_SCHEMA_VERSION",
    "SYNC_MODES",
    "TAG_OPTIONS",
    "OpConfig",
    "Plan",
    "SyncMode",
    "TagOption",
    "data_parallel",
    "data_parallel_per_tensor",
    "expert",
    "layerwise",
    "member_config",
    "single_device",
    "subset_data_parallel",
    "tag_group_config",
    "tag_strategy",
]
