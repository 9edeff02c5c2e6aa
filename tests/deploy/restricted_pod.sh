#!/usr/bin/env bash
# Start a command in an image's root as a restricted pod runs it, where no container runtime may run
# (podman run refused): run this under `unshare --mount --pid --fork`, so that its mounts and its
# processes belong to it alone.
#   usage: restricted_pod.sh STAGE ROOTFS UID GID SHM_SIZE TMP_SIZE -- COMMAND...   (as root)
#   STAGE: an empty directory to mount the pod's root on; sizes as tmpfs takes them (512m, 1g)
# - the image's root bind-mounted read-only (readOnlyRootFilesystem: true)
# - tmpfs where the pod has its emptyDirs: /dev/shm (medium: Memory) and /tmp; a /dev of its own
#   holding the usual device nodes only; /proc of its own PID namespace; /sys read-only
# - COMMAND started by the image's own setpriv: UID (an arbitrary one, as OpenShift assigns) in group
#   GID, no supplementary groups, every capability set emptied, no_new_privs; the environment is the
#   caller's (the image's ENV and the pod's env)
set -euo pipefail
stage=$1 rootfs=$2 uid=$3 gid=$4 shm_size=$5 tmp_size=$6
shift 6; [[ ${1:-} == -- ]] && shift

mount --make-rprivate /
mount --bind "$rootfs" "$stage"
mount -o remount,bind,ro "$stage"
mount -t proc -o nosuid,nodev,noexec proc "$stage/proc"
mount --bind /sys "$stage/sys"
mount -o remount,bind,ro "$stage/sys"
mount -t tmpfs -o nosuid,mode=755,size=64k tmpfs "$stage/dev"
for node in null zero full random urandom tty; do
  touch "$stage/dev/$node"
  mount --bind "/dev/$node" "$stage/dev/$node"
done
mkdir "$stage/dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777,size="$shm_size" tmpfs "$stage/dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777,size="$tmp_size" tmpfs "$stage/tmp"
cd "$stage"
exec chroot "$stage" /usr/bin/setpriv --reuid="$uid" --regid="$gid" --clear-groups \
  --inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs -- "$@"
