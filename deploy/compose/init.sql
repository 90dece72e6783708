-- GENERATED from migrations/*.sql.tmpl by
--   go test ./deploy/ -run TestComposeInitSQL -update
-- Do not edit by hand. Table public.outbox, publication outboxd, role outboxd.
-- The postgres image runs this once, on an empty data volume, as the
-- superuser in POSTGRES_DB (deploy/compose.yaml).

-- ===== migrations/001_outbox.sql.tmpl =====
-- The outbox table in Debezium's layout (Outbox Event Router defaults):
-- topic from aggregatetype, key from aggregateid, headers id and type, value = payload.
-- Services INSERT into it in the same transaction as their business rows.
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb        NOT NULL,
    created_at    timestamptz  NOT NULL DEFAULT now()
);

-- ===== migrations/003_publication.sql.tmpl =====
-- The publication outboxd streams. publish = 'insert' keeps UPDATEs, DELETEs and
-- TRUNCATEs of the outbox inside PostgreSQL, so "insert then delete in the same
-- transaction" outboxes cost nothing downstream.
DO $outboxd$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outboxd') THEN
        CREATE PUBLICATION "outboxd" FOR TABLE public.outbox WITH (publish = 'insert');
    ELSIF NOT EXISTS (SELECT 1 FROM pg_publication_tables
                      WHERE pubname = 'outboxd' AND format('%I.%I', schemaname, tablename) = 'public.outbox') THEN
        ALTER PUBLICATION "outboxd" ADD TABLE public.outbox;
    END IF;
END
$outboxd$;

-- ===== migrations/004_role.sql.tmpl =====
-- A least-privilege role for outboxd: it may open replication connections and
-- read the outbox table, nothing else. Set its password out of band:
--   ALTER ROLE "outboxd" PASSWORD '…';
-- outboxd creates its slot on first start (REPLICATION suffices for that).
-- EXECUTE on pg_logical_emit_message (every overload: PostgreSQL 17 added a
-- fourth argument, flush) is for outboxd's heartbeats (--heartbeat-interval):
-- granted to the role itself, so that revoking it from PUBLIC (hardening) does
-- not silently stop them. Only its owner (the bootstrap superuser) may grant
-- it; anyone else gets a notice.
-- pg_read_all_stats is for high availability: PostgreSQL shows a walsender's
-- reply_time (pg_stat_replication) only to its members, and without it a
-- standby cannot tell a frozen or partitioned active from a healthy one, so
-- it waits for wal_sender_timeout instead of --replication-timeout. It adds
-- reading other sessions' statistics and query text, less than REPLICATION
-- already allows (a base backup is the whole cluster). Only a role holding it
-- WITH ADMIN OPTION (a superuser) may grant it; anyone else gets a notice.
DO $outboxd$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outboxd') THEN
        CREATE ROLE "outboxd" WITH LOGIN REPLICATION;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), 'outboxd');
END
$outboxd$;
GRANT USAGE ON SCHEMA public TO "outboxd";
GRANT SELECT ON public.outbox TO "outboxd";
DO $outboxd$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, 'outboxd');
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'cannot grant EXECUTE on pg_logical_emit_message to %: heartbeats need it once it is revoked from PUBLIC', 'outboxd';
END
$outboxd$;
DO $outboxd$
BEGIN
    EXECUTE format('GRANT pg_read_all_stats TO %I', 'outboxd');
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'cannot grant pg_read_all_stats to %: a standby then cannot see whether the active replies, and takes over a frozen one only after wal_sender_timeout', 'outboxd';
END
$outboxd$;

-- Demo password only. In production set it out of band (deploy/README.md).
ALTER ROLE outboxd PASSWORD 'outboxd';
