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
# The admin password makes the admin user on the server's first start only (MLflow creates the
# user when its auth database has none, and later ignores the setting): change it afterwards
# through the API (AuthServiceClient.update_user_password), not in .env.
#
# tests/test_team_server.py starts a real server through this script; tests/test_infra.py
# checks its refusals.
set -eu
: "${MLFLOW_ADMIN_PASSWORD:?set MLFLOW_ADMIN_PASSWORD (infra/mlflow/.env)}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY (infra/mlflow/.env)}"

# env.example's placeholders all start with "change-me": a .env copied and not edited would
# start a server on every interface whose admin password is in the repository. Refused, the
# variable named, its value never printed (exit 2).
refuse_placeholder() {
  case "$2" in
    change-me*)
      echo "error: $1 still holds env.example's change-me placeholder: set a secret of your own" \
        "in infra/mlflow/.env, then start the server again" >&2
      exit 2 ;;
  esac
}
refuse_placeholder MLFLOW_ADMIN_PASSWORD "$MLFLOW_ADMIN_PASSWORD"
refuse_placeholder MLFLOW_FLASK_SERVER_SECRET_KEY "$MLFLOW_FLASK_SERVER_SECRET_KEY"
conf="${MLFLOW_AUTH_CONFIG_PATH:-/tmp/mlflow-basic-auth.ini}"
# MLflow reads the file with configparser, whose interpolation refuses a lone % (the server
# would not start with a password holding one, or a URL-encoded database password): each value
# is written with % doubled, which configparser reads back as one.
ini() { printf '%s' "$1" | sed 's/%/%%/g'; }
umask 077
cat > "$conf" <<CONF
[mlflow]
default_permission = $(ini "${MLFLOW_DEFAULT_PERMISSION:-READ}")
database_uri = $(ini "${MLFLOW_AUTH_DATABASE_URI:-sqlite:////auth/basic_auth.db}")
admin_username = $(ini "${MLFLOW_ADMIN_USERNAME:-admin}")
admin_password = $(ini "${MLFLOW_ADMIN_PASSWORD}")
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${MLFLOW_AUTH_CACHE_TTL_SECONDS:-60}
CONF
export MLFLOW_AUTH_CONFIG_PATH="$conf"
exec "$@"
