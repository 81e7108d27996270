"""What the generated worlds (BabyAI, household) share about their splits: each split draws its
seeds from its own range, so no two splits of a world ever play the same seed."""

from __future__ import annotations

from arena.core.contract.env import POOL_SPLIT, TEST_SPLITS, TRAIN_SPLIT, VALID_SPLIT

#: Seeds of split ``s`` are ``SPLIT_SEED_BASE[s] + draw`` (plus a world's own offset), draw below
#: ``MAX_SPLIT_SIZE``: disjoint ranges of seeds.
SPLIT_SEED_BASE = {
    TRAIN_SPLIT: 0,
    VALID_SPLIT: 1_000_000,
    TEST_SPLITS[0]: 2_000_000,
    TEST_SPLITS[1]: 3_000_000,
    POOL_SPLIT: 4_000_000,
}
MAX_SPLIT_SIZE = 1_000_000


def split_sizes(n_train: int, n_valid: int, n_test: int) -> dict[str, int]:
    """Each split's number of tasks (both test splits ``n_test``), each refused unless it fits
    its range of seeds."""
    sizes = {TRAIN_SPLIT: n_train, VALID_SPLIT: n_valid, TEST_SPLITS[0]: n_test, TEST_SPLITS[1]: n_test}
    for split, size in sizes.items():
        if not 0 <= size <= MAX_SPLIT_SIZE:
            key = "n_test" if split in TEST_SPLITS else f"n_{split}"
            raise ValueError(f"env.{key}: the {split} size must be in [0, {MAX_SPLIT_SIZE}], got {size}")
    return sizes
