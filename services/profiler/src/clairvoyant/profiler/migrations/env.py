"""Alembic environment of the profiler's schema.

``clairvoyant.profiler.persistence.upgrade`` hands over an open connection in
``config.attributes["connection"]``; otherwise (the ``alembic`` command line) ``sqlalchemy.url`` is
used.  The version table is the profiler's own, since the compose database is shared.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from clairvoyant.profiler.persistence import VERSION_TABLE, ProfileBase, make_engine

config = context.config


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=ProfileBase.metadata, version_table=VERSION_TABLE
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=ProfileBase.metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    assert url, "set sqlalchemy.url (or pass a connection in config.attributes)"
    engine = make_engine(url)
    with engine.connect() as conn:
        run_on(conn)
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
