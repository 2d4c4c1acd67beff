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
CONF
export MLFLOW_AUTH_CONFIG_PATH="$conf"
exec "$@"
