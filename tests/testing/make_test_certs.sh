#!/bin/bash
# A throw-away CA and the certificates it signs, for the TLS tests. Made fresh per test
# with the openssl CLI; `make deps` installs it, and without it this fails (exit 3) so the
# test fails rather than passing untested.
#   ca.pem, ca.key           the CA: what spgated's --tls_client_ca and the clients' --tls_ca name
#   server.pem, server.key   CN=localhost, SAN DNS:localhost and IP:127.0.0.1 (spgated's)
#   client.pem, client.key   CN=CLIENT_CN (default "worker"): a client certificate for mTLS
#   NAME.pem, NAME.key       CN=NAME for each further NAME (more clients, e.g. another role)
#                            or, for an argument NAME|SUBJECT|SANS, that subject (openssl's
#                            -subj form, "/O=ml/CN=ops-admin") and subjectAltNames ("DNS:a,
#                            URI:spiffe://c/ns/ml/sa/ops"; empty: none): typed identities
# Usage: make_test_certs.sh DIR [CLIENT_CN [NAME | NAME|SUBJECT|SANS ...]]
#        (openssl's output: DIR/openssl.log)
set -euo pipefail
dir=$1
client_cn=${2:-worker}
if ! command -v openssl > /dev/null; then
  echo "make_test_certs.sh: no openssl CLI (make deps installs Debian's openssl package)" >&2
  exit 3
fi
cd "$dir"
exec 3>&2 > openssl.log 2>&1
trap 'cat openssl.log >&3' ERR
# P-256 keys: as good as RSA here and much faster to make.
key=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${key[@]}" -days 1 -subj /CN=spgate-test-ca -keyout ca.key -out ca.pem
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > server.ext
openssl req "${key[@]}" -subj /CN=localhost -keyout server.key -out server.csr
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
  -extfile server.ext -out server.pem
openssl req "${key[@]}" -subj "/CN=${client_cn}" -keyout client.key -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
  -out client.pem
for spec in "${@:3}"; do
  IFS='|' read -r name subject sans <<< "${spec}"
  subject=${subject:-/CN=${name}}
  ext=()
  if [[ -n "${sans}" ]]; then
    printf 'subjectAltName=%s\n' "${sans}" > "${name}.ext"
    ext=(-extfile "${name}.ext")
  fi
  openssl req "${key[@]}" -subj "${subject}" -keyout "${name}.key" -out "${name}.csr"
  openssl x509 -req -in "${name}.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    "${ext[@]}" -out "${name}.pem"
done
