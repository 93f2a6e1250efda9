"""Calibration sets (#34): the analytic model's constants fitted for one GPU type and stack, versioned by name.

Revision ID: c34a7e51
Revises: 31runresume
Create Date: 2026-12-03 15:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = 'c34a7e51'
down_revision = '31runresume'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('calibration_sets',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('gpu', sa.String(length=128), nullable=False),
    sa.Column('stack', sa.JSON(), nullable=False),
    sa.Column('set_key', sa.String(length=512), nullable=False),
    sa.Column('constants', sa.JSON(), nullable=False),
    sa.Column('fit', sa.JSON(), nullable=False),
    sa.Column('sources', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name', 'version', name='uq_calibration_sets_name_version')
    )
    with op.batch_alter_table('calibration_sets', schema=None) as batch_op:
        batch_op.create_index('ix_calibration_sets_set_key', ['set_key', 'created_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('calibration_sets', schema=None) as batch_op:
        batch_op.drop_index('ix_calibration_sets_set_key')

    op.drop_table('calibration_sets')
