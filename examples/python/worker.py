"""Billing in Python: apply outboxd's events from the inbox table, each exactly once.

outboxd relays the orders service's outbox to the broker; ``outboxd inbox``
writes each event once into this database's ``inbox_events`` table (the row
is the dedupe record) and acknowledges it to the broker only after that
commit. This worker applies them with the SQL functions of
migrations/inbox_events.sql, in its own transactions::

    BEGIN;
    SELECT ... FROM inbox_claim('billing', 1);   -- the oldest unapplied event of an
                                                 -- aggregate no other worker holds
    SAVEPOINT effect;
    INSERT INTO ledger ...; UPDATE balances ...  -- the effect
    SELECT inbox_applied('billing', event_id);   -- marked in the same transaction
    COMMIT;

The effect and the mark commit together or not at all, so a worker killed at
any point leaves the event unapplied for the next claim, never applied twice.
Run as many workers as you like: an aggregate's events are applied one after
another, in the order they arrived, whichever worker takes them.

If the effect raises, it is rolled back to the savepoint and inbox_failed
counts the attempt: the event is retried after a backoff and parked after
--max-attempts; its aggregate's later events wait behind it, other aggregates
go on. A charge to a frozen account (a row in frozen_accounts) is such a
failure. After a fix (unfreezing the account),
``SELECT inbox_release('billing', '<aggregate>')`` lets them through, in order. Database errors (a lost connection, a restart) are not
attempts: the worker reconnects and claims again.

Usage::

    pip install -r requirements.txt
    outboxd inbox --broker kafka://127.0.0.1:9092 --group billing \\
        --topics outbox.event.Order --postgres postgres://.../billing --create-tables
    python worker.py --postgres postgresql://.../billing --consumer billing --create-tables

--create-tables runs migrations/inbox_events.sql (the same SQL outboxd inbox
--create-tables runs) and creates the ledger and balances tables.
"""

import argparse
import json
import logging
import os
import signal
import sys
import time

import psycopg
from psycopg import sql

HERE = os.path.dirname(os.path.abspath(__file__))
INBOX_SQL = os.path.join(HERE, "..", "..", "migrations", "inbox_events.sql")

BILLING_SCHEMA = """
CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS frozen_accounts (account text PRIMARY KEY);  -- charges refused
CREATE TABLE IF NOT EXISTS ledger (
    entry    bigserial PRIMARY KEY,  -- the order effects were applied in
    event_id text   NOT NULL,
    order_id bigint NOT NULL,
    account  text   NOT NULL,
    seq      bigint NOT NULL,
    cents    bigint NOT NULL
);
"""

log = logging.getLogger("billing")


class AccountFrozen(Exception):
    pass


def apply_effect(conn, event_id, payload):
    """The effect: a ledger entry and the balance, in the claiming transaction.

    A frozen account refuses the charge: the event fails, is retried, then
    parked, and the account's later orders wait behind it until the account
    is unfrozen and released (the other accounts go on).

    The ledger has deliberately no unique constraint on event_id: the inbox
    row alone keeps effects exactly once, and the tests count doubles.
    """
    order = json.loads(payload)
    if conn.execute("SELECT 1 FROM frozen_accounts WHERE account = %s", (order["account"],)).fetchone():
        raise AccountFrozen(f"account {order['account']} is frozen")
    conn.execute(
        "INSERT INTO ledger (event_id, order_id, account, seq, cents) VALUES (%s, %s, %s, %s, %s)",
        (event_id, order["order_id"], order["account"], order["seq"], order["cents"]),
    )
    conn.execute(
        "INSERT INTO balances VALUES (%s, %s) "
        "ON CONFLICT (account) DO UPDATE SET cents = balances.cents + excluded.cents",
        (order["account"], order["cents"]),
    )


class Worker:
    def __init__(self, args):
        self.args = args
        s = sql.Identifier(args.schema)
        self.claim = sql.SQL("SELECT event_id, aggregate, type, payload FROM {}.inbox_claim(%s, %s)").format(s)
        self.applied = sql.SQL("SELECT {}.inbox_applied(%s, %s)").format(s)
        self.failed = sql.SQL("SELECT {}.inbox_failed(%s, %s, %s, %s, make_interval(secs => %s))").format(s)
        self.stopping = False

    def stop(self, *_):
        self.stopping = True

    def step(self, conn):
        """One transaction: claim up to --batch events (heads of distinct
        aggregates), apply each, commit. Returns how many were claimed."""
        a = self.args
        with conn.transaction():
            events = conn.execute(self.claim, (a.consumer, a.batch)).fetchall()
            for event_id, aggregate, _type, payload in events:
                try:
                    with conn.transaction():  # a savepoint: a failed effect rolls back alone
                        apply_effect(conn, event_id, payload)
                        if a.effect_delay:
                            time.sleep(a.effect_delay)
                        conn.execute(self.applied, (a.consumer, event_id))
                except psycopg.OperationalError:
                    raise  # the database, not the event: not an attempt
                except Exception as e:  # the event's effect failed
                    parked = conn.execute(
                        self.failed, (a.consumer, event_id, repr(e), a.max_attempts, a.backoff)
                    ).fetchone()[0]
                    log.warning("event %s of %s failed (%r)%s", event_id, aggregate, e,
                                "; parked, its aggregate waits until inbox_release" if parked else "; retried later")
        return len(events)

    def run(self):
        a = self.args
        while not self.stopping:
            try:
                with psycopg.connect(a.postgres, autocommit=True, application_name=a.application_name) as conn:
                    log.info("applying events of consumer %s", a.consumer)
                    while not self.stopping:
                        if self.step(conn) == 0:
                            time.sleep(a.poll)
            except psycopg.OperationalError as e:
                if self.stopping:
                    break
                log.warning("database error, reconnecting: %s", e)
                time.sleep(0.5)
        log.info("stopped")


def create_tables(dsn):
    with open(INBOX_SQL) as f:
        inbox_sql = f.read()
    for attempt in range(20):  # two workers starting at once may race on CREATE
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(inbox_sql)
                conn.execute(BILLING_SCHEMA)
            return
        except psycopg.Error:
            if attempt == 19:
                raise
            time.sleep(0.25)


def main():
    p = argparse.ArgumentParser(description="Apply outboxd's order events from the inbox table to balances.")
    p.add_argument("--postgres", default=os.environ.get("BILLING_POSTGRES"), help="the billing database (libpq connection string)")
    p.add_argument("--consumer", default="billing", help="the consumer column: outboxd inbox --name")
    p.add_argument("--schema", default="public", help="schema of inbox_events and its functions")
    p.add_argument("--batch", type=int, default=1, help="events claimed per transaction (each of a different aggregate)")
    p.add_argument("--max-attempts", type=int, default=5, help="failed attempts after which an event is parked")
    p.add_argument("--backoff", type=float, default=1.0, help="seconds before the first retry of a failed event (doubling)")
    p.add_argument("--poll", type=float, default=0.05, help="seconds to wait when nothing is claimable")
    p.add_argument("--effect-delay", type=float, default=0, help="seconds to sleep inside each effect's transaction (tests)")
    p.add_argument("--application-name", default="billing-py", help="application_name in pg_stat_activity")
    p.add_argument("--create-tables", action="store_true", help="run migrations/inbox_events.sql and create ledger and balances")
    args = p.parse_args()
    if not args.postgres:
        p.error("--postgres (or BILLING_POSTGRES) is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.create_tables:
        create_tables(args.postgres)
    w = Worker(args)
    signal.signal(signal.SIGTERM, w.stop)
    signal.signal(signal.SIGINT, w.stop)
    w.run()


if __name__ == "__main__":
    main()
