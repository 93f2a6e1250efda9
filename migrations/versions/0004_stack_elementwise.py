"""Calibration sets: the stack gains ``elementwise`` (fused or eager elementwise ops, #34). A stored set was fitted
on fused kernels (the only stack there was), so its stack and its key (what a cluster's stack matches) gain
``elementwise = "fused"``: without it no request would find it again. The key is ``GPU|field=value,...`` over the
stack's fields in sorted order, as ``solvers.cost_model.calibration_set.set_key`` writes it; it is rebuilt here from
the row's GPU and stored stack, so this migration does not depend on how the code computes keys later.

Revision ID: 34elementwise
Revises: c34a7e51
Create Date: 2026-12-07 11:00:00
"""
from typing import Any

from alembic import op
import sqlalchemy as sa


revision = '34elementwise'
down_revision = 'c34a7e51'
branch_labels = None
depends_on = None

FIELD, VALUE = 'elementwise', 'fused'
SETS = sa.table('calibration_sets', sa.column('id', sa.String), sa.column('gpu', sa.String),
                sa.column('set_key', sa.String), sa.column('stack', sa.JSON))


def _key(gpu: str, stack: dict[str, Any]) -> str:
    """The key from the stored stack (the resolved stack's JSON the key was made from): values as Python prints
    them, so true and null read True and None as they did."""
    return gpu + '|' + ','.join(f'{k}={stack[k]}' for k in sorted(stack))


def _rewrite(add: bool) -> None:
    bind = op.get_bind()
    for row in bind.execute(sa.select(SETS.c.id, SETS.c.gpu, SETS.c.stack)).all():
        stack: dict[str, Any] = dict(row.stack)
        if add:
            stack.setdefault(FIELD, VALUE)
        elif stack.get(FIELD) == VALUE:
            del stack[FIELD]
        # (an eager set has no form before this revision: downgraded, it keeps its field and matches no request)
        bind.execute(SETS.update().where(SETS.c.id == row.id).values(set_key=_key(row.gpu, stack), stack=stack))


def upgrade() -> None:
    _rewrite(add=True)


def downgrade() -> None:
    _rewrite(add=False)
