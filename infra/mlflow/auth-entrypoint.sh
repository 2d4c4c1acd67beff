#!/bin/sh
# The team tracking server's entrypoint: writes MLflow's basic-auth configuration from the
# environment (the admin password never sits in a file of the repository), then runs the
# command it is given (`mlflow server --app-name basic-auth ...`, docker-compose.yaml).
#
#   MLFLOW_ADMIN_PASSWORD           the admin user's password (required)
#   MLFLOW_FLASK_SERVER_SECRET_KEY  signs the auth app's CSRF tokens (required)
#   MLFLOW_ADMIN_USERNAME           default: admin
#   MLFLOW_DEFAULT_PERMISSION       what users may do on experiments they did not create:
#                                   READ (default), EDIT, MANAGE or NO_PERMISSIONS
#   MLFLOW_AUTH_DATABASE_URI        users and permissions (default: sqlite on /auth)
#   MLFLOW_AUTH_CACHE_TTL_SECONDS   how long a worker keeps a login it has checked (default 60;
#                                   0: check the password's hash on every request)
#
# Every request of a run carries the user's password, and checking it against its stored hash
# costs tens of milliseconds of CPU by design (85 ms here): a training run makes 100-200 such
# requests. MLflow's credential cache checks each login once per worker and TTL window (a wrong
# password is never cached); a password changed or a user deleted through the API is dropped at
# once on the worker that handled it, and on the other workers within the TTL (MLflow's
# basic_auth.ini says the same).
#
# tests/test_team_server.py starts a real server through this script.
set -eu
: "${MLFLOW_ADMIN_PASSWORD:?set MLFLOW_ADMIN_PASSWORD (infra/mlflow/.env)}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY (infra/mlflow/.env)}"
conf="${MLFLOW_AUTH_CONFIG_PATH:-/tmp/mlflow-basic-auth.ini}"
umask 077
cat > "$conf" <<CONF
[mlflow]
default_permission = ${MLFLOW_DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DATABASE_URI:-sqlite:////auth/basic_auth.db}
admin_username = ${MLFLOW_ADMIN_USERNAME:-admin}
admin_password = ${MLFLOW_ADMIN_PASSWORD}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${MLFLOW_AUTH_CACHE_TTL_SECONDS:-60}
CONF
export MLFLOW_AUTH_CONFIG_PATH="$conf"
exec "$@"
