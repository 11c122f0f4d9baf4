# The image test's negative case (tests/deploy/image_test.sh): a binary that loads a shared
# library no Debian package owns — here a copy of libz under /usr/local/lib, found first
# by the loader — put through deploy/docker/runtime_packages.sh, the check the real
# Dockerfile runs. Built in the OCI format (no SHELL: every RUN is /bin/sh, as under
# podman's default), this build must fail naming the library.
FROM debian:bookworm
COPY deploy/docker/runtime_packages.sh /usr/local/bin/runtime_packages.sh
RUN mkdir -p /out/bin \
 && cp -L /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/local/lib/libz.so.1 \
 && ldconfig \
 && cp /usr/bin/gpgv /out/bin/uses-libz
RUN sh /usr/local/bin/runtime_packages.sh /out/bin /out/runtime-packages.txt
