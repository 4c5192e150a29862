#!/bin/sh
# compose.ha.yaml: run once by the postgres image when the primary's cluster is created.
# A replication role for the standby, and the pg_hba.conf line that lets it stream.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    --set pw="$REPLICATION_PASSWORD" <<'SQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'pw';
SELECT pg_create_physical_replication_slot('standby');
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
