#!/bin/sh
# compose.ha.yaml: the standby. Its first start clones the primary with pg_basebackup -R
# (which writes primary_conninfo, with application_name=standby so that the primary's
# synchronous_standby_names names it, and standby.signal); later starts just run it.
set -eu
PGDATA=/var/lib/postgresql/data
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    export PGPASSWORD="$REPLICATION_PASSWORD"
    until pg_basebackup -h "$PRIMARY_HOST" -U replicator -D "$PGDATA" -R -X stream \
        -S standby -d "application_name=standby"; do
        echo "waiting for the primary"; rm -rf "${PGDATA:?}"/*; sleep 2
    done
    chmod 0700 "$PGDATA"
fi
exec postgres -D "$PGDATA" -c hot_standby=on
