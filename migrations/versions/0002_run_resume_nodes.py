"""Runs: checkpoints (checkpoint_every_steps, resumed_from_step), a dataset file, and multi-node claims
(nodes_needed, ranks_per_node, nodes: the workers holding one lease per node).

Revision ID: 31runresume
Revises: 0001
Create Date: 2026-12-03 14:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '31runresume'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('checkpoint_every_steps', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('dataset', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('resumed_from_step', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('nodes_needed', sa.Integer(), nullable=False, server_default='1'))
        batch_op.add_column(sa.Column('ranks_per_node', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('nodes', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('nodes')
        batch_op.drop_column('ranks_per_node')
        batch_op.drop_column('nodes_needed')
        batch_op.drop_column('resumed_from_step')
        batch_op.drop_column('dataset')
        batch_op.drop_column('checkpoint_every_steps')
