#!/usr/bin/env bash
# Build (once per Python version) and install the Kompute Python module `kp` 0.9.0.
#
# usage: scripts/build-kp.sh VENV_PYTHON
#
# kp 0.9.0 ships no wheels, only an sdist whose CMake would git-clone its
# dependencies and whose setup.py has bugs.  We build it offline against the
# system Vulkan headers / fmt and pip's pybind11, after a small explicit patch,
# and cache the wheel outside the repo so fresh clones and rebuilt venvs reuse it.
# kp's C++ is patched too (command pool flag, barriers, device features: see below); KP_PATCH_LEVEL names that build,
# keys the wheel cache and is written into the venv, so an old cached wheel or venv gets rebuilt.
#
# env: VKACT_KP_SDIST=/path/kp-0.9.0.tar.gz  use this sdist instead of downloading it
#      XDG_CACHE_HOME                        cache root (default ~/.cache)
set -euo pipefail

PY=${1:?usage: build-kp.sh VENV_PYTHON}
KP_VERSION=0.9.0
# sha256 of kp-0.9.0.tar.gz as served by PyPI; guards the cached/downloaded sdist.
KP_SDIST_SHA256=98e583dc6e9731ff6d7a3e3317817e4d93f7b2945929619e29a56325db279949
PYBIND11_VERSION=3.1.0
# Bump when the patches below change: a new wheel cache directory and a reinstall in every venv
# (the wheel cache is shared, keyed by this name alone).
KP_PATCH_LEVEL=vkact10

step() { printf '==> %s\n' "$*"; }
die() { printf 'build-kp.sh: error: %s\n' "$*" >&2; exit 1; }

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/vkact
# Wheel name = what setuptools' bdist_wheel produces, e.g. kp-0.9.0-cp311-cp311-linux_x86_64.whl.
# Keyed on the interpreter's version and platform, so another Python rebuilds.
WHEEL_TAG=$("$PY" -c 'import sys, sysconfig
v = "cp%d%d" % sys.version_info[:2]
print("%s-%s-%s" % (v, v, sysconfig.get_platform().replace("-", "_").replace(".", "_")))')
WHEEL=$CACHE/wheels/$KP_PATCH_LEVEL/kp-$KP_VERSION-$WHEEL_TAG.whl

if [[ ! -f $WHEEL ]]; then
  # --- the sdist: given, cached, or downloaded from PyPI (source only: there is no wheel) ---
  SDIST=${VKACT_KP_SDIST:-$CACHE/sdist/kp-$KP_VERSION.tar.gz}
  if [[ ! -f $SDIST ]]; then
    step "downloading kp $KP_VERSION sdist"
    mkdir -p "$CACHE/sdist"
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$CACHE/sdist" "kp==$KP_VERSION" \
      || die "could not download kp==$KP_VERSION from PyPI; put the sdist somewhere and set VKACT_KP_SDIST=/path/kp-$KP_VERSION.tar.gz"
  fi
  echo "$KP_SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || die "$SDIST: sha256 mismatch"

  step "building kp $KP_VERSION wheel (about a minute per 2 cores)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  tar -xzf "$SDIST" -C "$WORK"
  SRC=$WORK/kp-$KP_VERSION

  # Patch kp's sources: setup.py (build bugs) and its C++ (Vulkan correctness). Each patch must apply
  # exactly once, else the sdist changed and we stop.
  "$PY" - "$SRC" <<'EOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1])
patches = {
    "setup.py": [
        # (1) Missing comma: the string literals concatenate, so -DPYTHON_EXECUTABLE never
        #     reaches CMake and it may pick another interpreter than the venv's.
        ("'-DKOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK=ON'\n",
         "'-DKOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK=ON',\n"),
        # (2) Built against pybind11 3.x, kp works with numpy 2; the numpy<2 pin would make
        #     pip's resolver downgrade our numpy (pyproject pins numpy 2.x).
        ('"numpy<2.0.0"', '"numpy"'),
        # (3) `list += str` splits "16" into "1","6": append the job count as one argument, so
        #     KOMPUTE_PYTHON_NUM_PARALLEL_THREADS bounds the otherwise unbounded `make -j`.
        ("build_args += env['KOMPUTE_PYTHON_NUM_PARALLEL_THREADS']",
         "build_args.append(env['KOMPUTE_PYTHON_NUM_PARALLEL_THREADS'])"),
    ],
    # (4) Sequences re-record their command buffer (clear/record/eval), which needs a pool created
    #     with RESET_COMMAND_BUFFER (VUID-vkBeginCommandBuffer-commandBuffer-00050); Kompute's PR 392.
    "src/Sequence.cpp": [
        ("vk::CommandPoolCreateInfo commandPoolInfo(vk::CommandPoolCreateFlags(),",
         "vk::CommandPoolCreateInfo commandPoolInfo(vk::CommandPoolCreateFlagBits::eResetCommandBuffer,"),
    ],
    # (5) The dispatch's barrier made transfer writes (the staging uploads) visible to shader reads
    #     only, but a kernel also writes buffers that were uploaded (in place, and outputs cleared
    #     before a strided kernel): a write-after-write race (SYNC-HAZARD-WRITE-AFTER-WRITE). One
    #     global barrier, transfer and shader writes before shader reads and writes, covers every
    #     tensor, and orders a dispatch after the earlier dispatches of its command buffer (a graph's
    #     steps read what the step before wrote: service/engine_graph.py).
    "src/OpAlgoDispatch.cpp": [
        ("""    for (const std::shared_ptr<Tensor>& tensor :
         this->mAlgorithm->getTensors()) {
        tensor->recordPrimaryBufferMemoryBarrier(
          commandBuffer,
          vk::AccessFlagBits::eTransferWrite,
          vk::AccessFlagBits::eShaderRead,
          vk::PipelineStageFlagBits::eTransfer,
          vk::PipelineStageFlagBits::eComputeShader);
    }
""",
         """    const vk::MemoryBarrier uploaded(
      vk::AccessFlagBits::eTransferWrite | vk::AccessFlagBits::eShaderWrite,
      vk::AccessFlagBits::eShaderRead | vk::AccessFlagBits::eShaderWrite);
    commandBuffer.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer |
                                    vk::PipelineStageFlagBits::eComputeShader,
                                  vk::PipelineStageFlagBits::eComputeShader,
                                  vk::DependencyFlags(),
                                  uploaded,
                                  nullptr,
                                  nullptr);
"""),
    ],
    # (6) The download's last barrier (transfer write -> host read) named the device buffer, not the
    #     staging buffer that the copy wrote and the host reads; and a host-memory tensor, which the
    #     shader writes and the host reads directly, got none: a fence alone does not make device
    #     writes visible to the host. Both get theirs.
    "src/OpTensorSyncLocal.cpp": [
        ("""            this->mTensors[i]->recordPrimaryBufferMemoryBarrier(
              commandBuffer,
              vk::AccessFlagBits::eTransferWrite,
              vk::AccessFlagBits::eHostRead,
              vk::PipelineStageFlagBits::eTransfer,
              vk::PipelineStageFlagBits::eHost);
        }
""",
         """            this->mTensors[i]->recordStagingBufferMemoryBarrier(
              commandBuffer,
              vk::AccessFlagBits::eTransferWrite,
              vk::AccessFlagBits::eHostRead,
              vk::PipelineStageFlagBits::eTransfer,
              vk::PipelineStageFlagBits::eHost);
        } else if (this->mTensors[i]->tensorType() ==
                   Tensor::TensorTypes::eHost) {
            this->mTensors[i]->recordPrimaryBufferMemoryBarrier(
              commandBuffer,
              vk::AccessFlagBits::eShaderWrite,
              vk::AccessFlagBits::eHostRead,
              vk::PipelineStageFlagBits::eComputeShader,
              vk::PipelineStageFlagBits::eHost);
        }
"""),
    ],
    # (7) kp creates its VkDevice with no features at all, so a shader that uses 64-bit arithmetic is a
    #     validation error (VUID-VkShaderModuleCreateInfo-pCode-01091) and undefined behaviour. Enable
    #     the features vkact's kernels use (service/descriptors/datatypes.py KERNEL_FEATURES) where the
    #     device reports them, and never one that it does not (a validation error, or a failed device).
    "src/Manager.cpp": [
        ("""    vk::DeviceCreateInfo deviceCreateInfo(vk::DeviceCreateFlags(),
                                          deviceQueueCreateInfos.size(),
                                          deviceQueueCreateInfos.data(),
                                          {},
                                          {},
                                          validExtensions.size(),
                                          validExtensions.data());
""",
         """    const vk::PhysicalDeviceFeatures reported = physicalDevice.getFeatures();
    vk::PhysicalDeviceFeatures enabledFeatures;
    enabledFeatures.shaderFloat64 = reported.shaderFloat64;
    enabledFeatures.shaderInt64 = reported.shaderInt64;
    vk::DeviceCreateInfo deviceCreateInfo(vk::DeviceCreateFlags(),
                                          deviceQueueCreateInfos.size(),
                                          deviceQueueCreateInfos.data(),
                                          {},
                                          {},
                                          validExtensions.size(),
                                          validExtensions.data(),
                                          &enabledFeatures);
"""),
    ],
    # (8) Host-visible memory (a host tensor, a device tensor's staging buffer) took the first type
    #     that is HOST_VISIBLE|HOST_COHERENT. On a discrete GPU that is uncached, write-combined system
    #     memory, which the CPU reads at a few GB/s: every answer copied out of it crawled (the first
    #     run on an NVIDIA H200: Engine.execute moved 5 GB/s). A type that is also HOST_CACHED is taken
    #     where the device has one; else the first as before (on lavapipe and SwiftShader their one
    #     host-visible type is already cached: nothing changes there).
    "src/Tensor.cpp": [
        ("""    uint32_t memoryTypeIndex = -1;
    bool memoryTypeIndexFound = false;
    for (uint32_t i = 0; i < memoryProperties.memoryTypeCount; i++) {
        if (memoryRequirements.memoryTypeBits & (1 << i)) {
            if (((memoryProperties.memoryTypes[i]).propertyFlags &
                 memoryPropertyFlags) == memoryPropertyFlags) {
                memoryTypeIndex = i;
                memoryTypeIndexFound = true;
                break;
            }
        }
    }
""",
         """    uint32_t memoryTypeIndex = -1;
    bool memoryTypeIndexFound = false;
    const bool hostVisible =
      bool(memoryPropertyFlags & vk::MemoryPropertyFlagBits::eHostVisible);
    for (int pass = hostVisible ? 0 : 1; pass < 2 && !memoryTypeIndexFound;
         pass++) {
        const vk::MemoryPropertyFlags wanted =
          pass == 0 ? memoryPropertyFlags |
                        vk::MemoryPropertyFlagBits::eHostCached
                    : memoryPropertyFlags;
        for (uint32_t i = 0; i < memoryProperties.memoryTypeCount; i++) {
            if (memoryRequirements.memoryTypeBits & (1 << i)) {
                if (((memoryProperties.memoryTypes[i]).propertyFlags &
                     wanted) == wanted) {
                    memoryTypeIndex = i;
                    memoryTypeIndexFound = true;
                    break;
                }
            }
        }
    }
"""),
    ],
    # (9) evalAwait slept in vkWaitForFences at once. KP_FENCE_SPIN_US (read once; default 0: unchanged)
    #     polls the fence that many microseconds first: a driver whose blocking wait wakes late (a
    #     question the first NVIDIA run raised: one dispatch's wall time far above its work) can be
    #     measured with and without it (bench/gpu_diag.py) before any default uses it.
    "src/Sequence.cpp#await": [
        ("""    vk::Result result =
      this->mDevice->waitForFences(1, &this->mFence, VK_TRUE, waitFor);
""",
         """    static const long spinUs = [] {
        const char* value = std::getenv("KP_FENCE_SPIN_US");
        return value ? std::strtol(value, nullptr, 10) : 0L;
    }();
    if (spinUs > 0) {
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::microseconds(spinUs);
        while (this->mDevice->getFenceStatus(this->mFence) ==
                 vk::Result::eNotReady &&
               std::chrono::steady_clock::now() < until) {
        }
    }
    vk::Result result =
      this->mDevice->waitForFences(1, &this->mFence, VK_TRUE, waitFor);
"""),
        ("#include \"kompute/Sequence.hpp\"\n",
         "#include \"kompute/Sequence.hpp\"\n\n#include <chrono>\n#include <cstdlib>\n"),
    ],
    # (10) every eval made a fence and destroyed it after the wait. On an NVIDIA H100 (driver 580.159.04, a
    #      Firecracker VM) vkCreateFence took 268 us and vkDestroyFence 238 (bench/native/vk_submit.c): 0.5 ms of
    #      each eval, where the dispatch of 2^16 elements takes 5 us on the GPU. One fence per sequence, made at
    #      its first eval, reset after each wait and destroyed with the sequence (a wait that timed out still
    #      destroys it, as before: it may be pending; so does a reset that failed: the fence is still signalled,
    #      and the next eval's wait would return at once, before its dispatch).
    "src/Sequence.cpp#fence": [
        ("""    this->mFence = this->mDevice->createFence(vk::FenceCreateInfo());
""",
         """    if (!this->mFence) {
        this->mFence = this->mDevice->createFence(vk::FenceCreateInfo());
    }
"""),
        ("""    this->mDevice->destroy(
      this->mFence, (vk::Optional<const vk::AllocationCallbacks>)nullptr);

    this->mIsRunning = false;
""",
         """    if (result == vk::Result::eTimeout ||
        this->mDevice->resetFences(1, &this->mFence) != vk::Result::eSuccess) {
        // pending, or signalled still (a reset can fail out of memory): never
        // submitted again; the next eval makes another
        this->mDevice->destroy(
          this->mFence, (vk::Optional<const vk::AllocationCallbacks>)nullptr);
        this->mFence = nullptr;
    }

    this->mIsRunning = false;
"""),
        ("""    if (this->mOperations.size()) {
        KP_LOG_INFO("Kompute Sequence clearing operations buffer");
""",
         """    if (this->mFence) {
        this->mDevice->destroy(
          this->mFence, (vk::Optional<const vk::AllocationCallbacks>)nullptr);
        this->mFence = nullptr;
    }

    if (this->mOperations.size()) {
        KP_LOG_INFO("Kompute Sequence clearing operations buffer");
"""),
    ],
    # (11) Tensors on memory the process already has (VK_EXT_external_memory_host), for a CPU device to run
    #      a kernel straight on the shared-memory slot a request's bytes were read into, where the engine
    #      copied them into a buffer of its own and the answer back out (two 16 MiB copies, 4-5 ms of a
    #      16 MiB request on llvmpipe). Tensor::importHost imports a page-aligned range as a host tensor's
    #      memory; Tensor::view binds a buffer to part of an imported tensor's memory (the view holds the
    #      tensor: its memory outlives the view). Neither maps memory of its own at destroy, nor frees the
    #      memory it does not own.
    "src/include/kompute/Tensor.hpp": [
        ("""    static std::string toString(TensorDataTypes dt);
    static std::string toString(TensorTypes dt);
""",
         """    static std::string toString(TensorDataTypes dt);
    static std::string toString(TensorTypes dt);

    // vkact (11): a host tensor (32-bit words) on `bytes` of host memory at `pointer` (imported: the
    // caller keeps it mapped until the tensor is destroyed), and one on part of an imported tensor.
    static std::shared_ptr<Tensor> importHost(
      std::shared_ptr<vk::PhysicalDevice> physicalDevice,
      std::shared_ptr<vk::Device> device,
      void* pointer,
      uint32_t bytes);
    static std::shared_ptr<Tensor> view(std::shared_ptr<Tensor> parent,
                                        uint32_t offset,
                                        uint32_t bytes);
"""),
        ("""  private:
    // -------------- NEVER OWNED RESOURCES
    std::shared_ptr<vk::PhysicalDevice> mPhysicalDevice;
    std::shared_ptr<vk::Device> mDevice;
""",
         """  private:
    // -------------- NEVER OWNED RESOURCES
    std::shared_ptr<vk::PhysicalDevice> mPhysicalDevice;
    std::shared_ptr<vk::Device> mDevice;

    // vkact (11): an imported tensor's memory type; a view's parent; memory this tensor never mapped
    Tensor(std::shared_ptr<vk::PhysicalDevice> physicalDevice,
           std::shared_ptr<vk::Device> device,
           uint32_t bytes);
    void createImportBuffer();
    bool mImported = false;
    uint32_t mMemoryTypeIndex = 0;
    std::shared_ptr<Tensor> mParent;
    bool mNotMapped = false;
"""),
    ],
    "src/Tensor.cpp#import": [
        ("""    // Unmap the current memory data
    if (this->tensorType() != Tensor::TensorTypes::eStorage) {
        this->unmapRawData();
    }
""",
         """    // Unmap the current memory data (vkact: none where this tensor never mapped it, as a view)
    if (this->tensorType() != Tensor::TensorTypes::eStorage &&
        !this->mNotMapped) {
        this->unmapRawData();
    }
    this->mParent = nullptr;
"""),
        ("""template<>
Tensor::TensorDataTypes
TensorT<bool>::dataType()
""",
         """Tensor::Tensor(std::shared_ptr<vk::PhysicalDevice> physicalDevice,
               std::shared_ptr<vk::Device> device,
               uint32_t bytes)
{
    this->mPhysicalDevice = physicalDevice;
    this->mDevice = device;
    this->mDataType = TensorDataTypes::eUnsignedInt;
    this->mTensorType = TensorTypes::eHost;
    this->mSize = bytes / sizeof(uint32_t);
    this->mDataTypeMemorySize = sizeof(uint32_t);
    this->mRawData = nullptr;
    this->mNotMapped = true;
}

void
Tensor::createImportBuffer()
{
    if (this->memorySize() == 0 || this->memorySize() % sizeof(uint32_t)) {
        throw std::runtime_error(
          "Kompute Tensor import: size must be a positive multiple of 4");
    }
    vk::ExternalMemoryBufferCreateInfo external(
      vk::ExternalMemoryHandleTypeFlagBits::eHostAllocationEXT);
    vk::BufferCreateInfo bufferInfo(vk::BufferCreateFlags(),
                                    this->memorySize(),
                                    this->getPrimaryBufferUsageFlags(),
                                    vk::SharingMode::eExclusive,
                                    0,
                                    nullptr,
                                    &external);
    this->mPrimaryBuffer =
      std::make_shared<vk::Buffer>(this->mDevice->createBuffer(bufferInfo));
    this->mFreePrimaryBuffer = true;
}

std::shared_ptr<Tensor>
Tensor::importHost(std::shared_ptr<vk::PhysicalDevice> physicalDevice,
                   std::shared_ptr<vk::Device> device,
                   void* pointer,
                   uint32_t bytes)
{
    auto pointerProperties =
      reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        device->getProcAddr("vkGetMemoryHostPointerPropertiesEXT"));
    if (!pointerProperties) {
        throw std::runtime_error("Kompute Tensor import: "
                                 "VK_EXT_external_memory_host is not enabled");
    }
    std::shared_ptr<Tensor> tensor{ new Tensor(physicalDevice, device, bytes) };
    tensor->createImportBuffer();
    VkMemoryHostPointerPropertiesEXT hostProperties{};
    hostProperties.sType =
      VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT;
    if (pointerProperties(
          *device,
          VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
          pointer,
          &hostProperties) != VK_SUCCESS) {
        throw std::runtime_error(
          "Kompute Tensor import: the pointer cannot be imported");
    }
    const vk::MemoryRequirements requirements =
      device->getBufferMemoryRequirements(*tensor->mPrimaryBuffer);
    const vk::PhysicalDeviceMemoryProperties memoryProperties =
      physicalDevice->getMemoryProperties();
    const vk::MemoryPropertyFlags wanted =
      vk::MemoryPropertyFlagBits::eHostVisible |
      vk::MemoryPropertyFlagBits::eHostCoherent;
    const uint32_t types =
      requirements.memoryTypeBits & hostProperties.memoryTypeBits;
    uint32_t index = memoryProperties.memoryTypeCount;
    for (uint32_t i = 0; i < memoryProperties.memoryTypeCount; i++) {
        if ((types & (1u << i)) &&
            (memoryProperties.memoryTypes[i].propertyFlags & wanted) ==
              wanted) {
            index = i;
            break;
        }
    }
    if (index == memoryProperties.memoryTypeCount ||
        requirements.size > bytes) {
        throw std::runtime_error("Kompute Tensor import: no host-coherent "
                                 "memory type takes the pointer");
    }
    vk::ImportMemoryHostPointerInfoEXT importInfo(
      vk::ExternalMemoryHandleTypeFlagBits::eHostAllocationEXT, pointer);
    vk::MemoryAllocateInfo allocateInfo(bytes, index, &importInfo);
    tensor->mPrimaryMemory =
      std::make_shared<vk::DeviceMemory>(device->allocateMemory(allocateInfo));
    tensor->mFreePrimaryMemory = true;
    device->bindBufferMemory(*tensor->mPrimaryBuffer, *tensor->mPrimaryMemory, 0);
    tensor->mImported = true;
    tensor->mMemoryTypeIndex = index;
    tensor->mapRawData();
    tensor->mNotMapped = false;
    return tensor;
}

std::shared_ptr<Tensor>
Tensor::view(std::shared_ptr<Tensor> parent, uint32_t offset, uint32_t bytes)
{
    if (!parent || !parent->mImported || !parent->mPrimaryMemory ||
        !parent->mDevice) {
        throw std::runtime_error(
          "Kompute Tensor view: the parent is not a live imported tensor");
    }
    const uint32_t whole = parent->memorySize();
    if (offset > whole || bytes > whole - offset) {
        throw std::runtime_error(
          "Kompute Tensor view: the range is outside its parent");
    }
    std::shared_ptr<Tensor> tensor{ new Tensor(
      parent->mPhysicalDevice, parent->mDevice, bytes) };
    tensor->createImportBuffer();
    const vk::MemoryRequirements requirements =
      parent->mDevice->getBufferMemoryRequirements(*tensor->mPrimaryBuffer);
    if (offset % requirements.alignment ||
        requirements.size > whole - offset ||
        !(requirements.memoryTypeBits & (1u << parent->mMemoryTypeIndex))) {
        throw std::runtime_error(
          "Kompute Tensor view: the buffer cannot be bound at that offset");
    }
    parent->mDevice->bindBufferMemory(
      *tensor->mPrimaryBuffer, *parent->mPrimaryMemory, offset);
    tensor->mPrimaryMemory = parent->mPrimaryMemory;
    tensor->mFreePrimaryMemory = false;
    tensor->mRawData = static_cast<char*>(parent->mRawData) + offset;
    tensor->mParent = parent;
    return tensor;
}

template<>
Tensor::TensorDataTypes
TensorT<bool>::dataType()
"""),
    ],
    "src/include/kompute/Manager.hpp": [
        ("""    /**
     * Default non-template function that can be used to create algorithm
""",
         """    // vkact (11): Tensor::importHost and Tensor::view, managed as the other tensors
    std::shared_ptr<Tensor> importHost(void* pointer, uint32_t bytes)
    {
        return this->manage(
          Tensor::importHost(this->mPhysicalDevice, this->mDevice, pointer, bytes));
    }

    std::shared_ptr<Tensor> tensorView(std::shared_ptr<Tensor> parent,
                                       uint32_t offset,
                                       uint32_t bytes)
    {
        return this->manage(Tensor::view(parent, offset, bytes));
    }

    std::shared_ptr<Tensor> manage(std::shared_ptr<Tensor> tensor)
    {
        if (this->mManageResources) {
            this->mManagedTensors.push_back(tensor);
        }
        return tensor;
    }

    /**
     * Default non-template function that can be used to create algorithm
"""),
    ],
    "python/src/main.cpp": [
        ("""      .def("destroy", &kp::Manager::destroy, DOC(kp, Manager, destroy))
""",
         """      .def("destroy", &kp::Manager::destroy, DOC(kp, Manager, destroy))
      .def(
        "import_host",
        [](kp::Manager& self, uintptr_t address, uint32_t nbytes) {
            return self.importHost(reinterpret_cast<void*>(address), nbytes);
        },
        "vkact: a host tensor on nbytes of this process's memory at address "
        "(page-aligned; kept mapped until the tensor is destroyed)",
        py::arg("address"),
        py::arg("nbytes"))
      .def("tensor_view",
           &kp::Manager::tensorView,
           "vkact: a tensor on nbytes of an imported tensor's memory, from offset",
           py::arg("parent"),
           py::arg("offset"),
           py::arg("nbytes"))
"""),
    ],
    # (12) A pipeline's build (vkCreateComputePipelines: lavapipe compiles the shader there, 90-190 ms for a
    #      softmax kernel here) held the GIL, so every other Python thread of the process stopped for it: the
    #      device worker's job thread could not serve other requests while a new graph's pipelines were built
    #      on a thread beside it. The build now runs through a gate that the binding sets to release the GIL
    #      for that one call, and only that: it touches nothing but its own new objects (its own pipeline
    #      cache; Vulkan's object creation needs no external synchronisation), no KP_LOG (built with logging
    #      Off), no exception crosses the gate (the C entry point, a vk::Result), and kp's unlocked state (the
    #      Manager's lists, push constants, queue submits: patch 13 adds a lock for those) stays under the GIL.
    "src/Algorithm.cpp": [
        ("""#include "kompute/Algorithm.hpp"

namespace kp {
""",
         """#include "kompute/Algorithm.hpp"

namespace kp {

// vkact (12): set by the Python binding (the GIL released around the build); null: the build runs as is
void (*pipelineBuildGate)(void (*build)(void*), void* context) = nullptr;
"""),
        ("""#ifdef KOMPUTE_CREATE_PIPELINE_RESULT_VALUE
    vk::ResultValue<vk::Pipeline> pipelineResult =
      this->mDevice->createComputePipeline(*this->mPipelineCache, pipelineInfo);

    if (pipelineResult.result != vk::Result::eSuccess) {
        throw std::runtime_error("Failed to create pipeline result: " +
                                 vk::to_string(pipelineResult.result));
    }

    vk::Pipeline& pipeline = pipelineResult.value;
    this->mPipeline = std::make_shared<vk::Pipeline>(pipeline);
    this->mFreePipeline = true;
#else
    vk::Pipeline pipeline =
      this->mDevice->createComputePipeline(*this->mPipelineCache, pipelineInfo)
        .value;
    this->mPipeline = std::make_shared<vk::Pipeline>(pipeline);
    this->mFreePipeline = true;
#endif
""",
         """    struct Build
    {
        vk::Device* device;
        vk::PipelineCache cache;
        const vk::ComputePipelineCreateInfo* info;
        vk::Pipeline pipeline;
        vk::Result result;
    } build{ this->mDevice.get(), *this->mPipelineCache, &pipelineInfo,
             vk::Pipeline(), vk::Result::eSuccess };
    void (*run)(void*) = [](void* context) {
        Build* b = static_cast<Build*>(context);
        b->result = b->device->createComputePipelines(
          b->cache, 1, b->info, nullptr, &b->pipeline);
    };
    if (pipelineBuildGate) {
        pipelineBuildGate(run, &build);
    } else {
        run(&build);
    }
    if (build.result != vk::Result::eSuccess) {
        throw std::runtime_error("Failed to create pipeline result: " +
                                 vk::to_string(build.result));
    }
    this->mPipeline = std::make_shared<vk::Pipeline>(build.pipeline);
    this->mFreePipeline = true;
"""),
    ],
    # (13) A queue submission under a lock, and an eval without the GIL for the graph build thread: lavapipe
    #      generates a pipeline's machine code at its first dispatch (a new 60-node graph's first run took
    #      4.2 s here, its second 12.5 ms), on the device's one queue; the build thread runs each new graph once
    #      with eval_released, waiting without the GIL, so the job thread goes on meanwhile. Two threads then
    #      submit to one VkQueue, which needs external synchronisation: every submission takes one lock (held
    #      for the vkQueueSubmit call alone; never while waiting for the GIL).
    "src/Sequence.cpp#submit": [
        ("""#include "kompute/Sequence.hpp"
""",
         """#include "kompute/Sequence.hpp"

#include <mutex>
"""),
        ("""    this->mComputeQueue->submit(1, &submitInfo, this->mFence);
""",
         """    {
        static std::mutex submitting;  // vkact (13): the queue's external synchronisation
        std::lock_guard<std::mutex> hold(submitting);
        this->mComputeQueue->submit(1, &submitInfo, this->mFence);
    }
"""),
    ],
    "python/src/main.cpp#released": [
        ("""      .def(
        "eval_async",
        [](kp::Sequence& self) { return self.eval(); },""",
         """      .def(
        "eval_released",
        [](kp::Sequence& self) {
            py::gil_scoped_release release;
            self.eval();
        },
        "vkact: eval() without the GIL (the sequence and what it records are the caller's alone)")
      .def(
        "eval_async",
        [](kp::Sequence& self) { return self.eval(); },"""),
    ],
    "python/src/main.cpp#gil": [
        ("""PYBIND11_MODULE(kp, m)
{
""",
         """namespace kp {
extern void (*pipelineBuildGate)(void (*build)(void*), void* context);
}

PYBIND11_MODULE(kp, m)
{
    // vkact (12): a pipeline build without the GIL (the caller holds it, as every call into kp does)
    kp::pipelineBuildGate = [](void (*build)(void*), void* context) {
        py::gil_scoped_release release;
        build(context);
    };
"""),
    ],
}
for name, edits in patches.items():
    path = src / name.split("#")[0]  # "file#what": a second group of edits to one file
    text = path.read_text()
    for old, new in edits:
        if text.count(old) != 1:
            sys.exit(f"build-kp.sh: kp {name} patch does not apply: {old[:60]!r}")
        text = text.replace(old, new)
    path.write_text(text)
EOF

  # Build tools go into the venv because we build without isolation (pybind11's CMake config
  # must be visible to kp's CMake); pinned so the wheel is reproducible.
  "$PY" -m pip install -q "pybind11==$PYBIND11_VERSION" setuptools wheel

  # kp's CMake reads these from the environment.  OFF = use system Vulkan headers, system fmt
  # (libfmt-dev) and pip's pybind11 instead of git-cloning them at build time.
  # KOMPUTE_OPT_INSTALL=OFF: setup.py never runs `cmake --install`, and the install rules fail
  # to configure with an installed pybind11 (pybind11::headers is not an ALIAS target there).
  export KOMPUTE_OPT_USE_BUILT_IN_VULKAN_HEADER=OFF \
         KOMPUTE_OPT_INSTALL=OFF \
         KOMPUTE_OPT_USE_BUILT_IN_FMT=OFF \
         KOMPUTE_OPT_USE_BUILT_IN_PYBIND11=OFF \
         KOMPUTE_OPT_DISABLE_VK_DEBUG_LAYERS=ON \
         KOMPUTE_OPT_LOG_LEVEL=Off \
         KOMPUTE_PYTHON_NUM_PARALLEL_THREADS=$(nproc) \
         CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
  pybind11_DIR=$("$PY" -m pybind11 --cmakedir)
  export pybind11_DIR   # find_package(pybind11) looks at this environment variable

  "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" "$SRC" \
    || die "building kp failed (see the compiler output above); it needs: cmake make g++ libvulkan-dev libfmt-dev and the Python headers (python3-dev)"
  built=("$WORK"/dist/kp-$KP_VERSION-*.whl)
  [[ -f ${built[0]} && $(basename "${built[0]}") == "$(basename "$WHEEL")" ]] \
    || die "unexpected wheel name ${built[*]##*/}, expected ${WHEEL##*/}"
  mkdir -p "${WHEEL%/*}"
  cp "${built[0]}" "$WHEEL.tmp.$$" && mv "$WHEEL.tmp.$$" "$WHEEL"   # atomic: no half wheels in the cache
else
  step "using cached $WHEEL"
fi

# --no-deps: numpy comes from the project's own pins.
"$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
# setup.sh compares this with KP_PATCH_LEVEL to rebuild a venv that holds an older kp build.
echo "$KP_PATCH_LEVEL" >"$("$PY" -c 'import sys; print(sys.prefix)')/.vkact-kp-patch"
