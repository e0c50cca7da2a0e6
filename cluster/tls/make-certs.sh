#!/usr/bin/env bash
# Make a private CA and certificates signed by it, for Dask TLS (mutual authentication).
#
#   bash cluster/tls/make-certs.sh DIR [NAME...]      (default names: scheduler worker client)
#
# Writes DIR/ca.pem (give it to everyone), DIR/ca.key (keep it offline: it signs new certs),
# and DIR/NAME.pem + DIR/NAME.key for each NAME. Every certificate is valid for both sides of a
# TLS connection (Dask nodes are servers and clients) and names 127.0.0.1 / localhost; set
# SAN="DNS:node1.example.org,IP:10.0.0.5" to name real hosts, DAYS to change the 365-day validity.
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR [NAME...]}
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(scheduler worker client)
days=${DAYS:-365}
san=${SAN:-DNS:localhost,IP:127.0.0.1}
mkdir -p "$dir"
umask 077
newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 "${newkey[@]}" -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" \
    -subj "/CN=ordnmf-dask CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
ext=$(mktemp)
trap 'rm -f "$ext"' EXIT
cat > "$ext" <<CNF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
CNF
for name in "${names[@]}"; do
  openssl req "${newkey[@]}" -keyout "$dir/$name.key" -out "$dir/$name.csr" \
    -subj "/CN=ordnmf-dask $name" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$name.pem" -days "$days" -extfile "$ext" 2>/dev/null
  rm -f "$dir/$name.csr"
done
chmod 644 "$dir"/*.pem
echo "CA $dir/ca.pem; certificates: ${names[*]}"
