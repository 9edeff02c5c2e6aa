# Sourced by scripts/gpu-bundle.sh and scripts/gpu-run.sh (from the repo root): a digest of the sources that
# .gpu/'s compiled parts depend on (service/native's C, glsl/, kp's build script), so that a run warns
# when .gpu/ was built from other sources than the checkout's.
sources_hash() {
  # the files in one order on every host: a glob's and sort's order follow the locale's collation (the H200
  # host hashed the same files otherwise than this machine, whose locale is C.UTF-8, and every run there warned
  # of other sources; the locale is the likely difference, not yet checked there)
  local -x LC_ALL=C
  printf 'native %s\nglsl %s\nkp %s\n' "$(cat service/native/*.c service/native/*.h | sha256sum | cut -c1-16)" \
    "$(find glsl -type f | sort | xargs cat | sha256sum | cut -c1-16)" "$(sha256sum scripts/build-kp.sh | cut -c1-16)"
}
