/* bench/native/vk_submit.c: what one submission and its wait cost on a Vulkan device, call by call.
 *
 * kp 0.9's Sequence::eval makes a fence, submits the recorded command buffer, waits for the fence and
 * destroys it. On an NVIDIA H100 (driver 580.159.04, Firecracker VM) that eval took about 0.55 ms more
 * than its dispatch's GPU time whatever the size (bench/gpu_diag.py), and polling the fence first did not
 * help. This program times the same steps without kp or Python, and the other ways Vulkan offers to wait
 * (a reused fence, polling it, vkQueueWaitIdle, a timeline semaphore waited on or polled), with a small
 * dispatch and with an empty command buffer, so that the cost can be put on one call.
 *
 * Build: cc -O2 -o vk_submit vk_submit.c -lvulkan (its shader is SPIR-V made by glslangValidator; see
 * scripts/vk-submit.sh). Run: vk_submit [iterations] — prints a markdown table; the device is the first that
 * is not a CPU, or the first (VK_DRIVER_FILES picks the driver).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vulkan/vulkan.h>

#include "vk_submit_spv.h" /* const uint32_t vk_submit_spv[]: layout(local_size_x = 256) ... d[i] += 1 */

#define CHECK(call)                                                               \
    do {                                                                          \
        VkResult r_ = (call);                                                     \
        if (r_ != VK_SUCCESS) {                                                   \
            fprintf(stderr, "vk_submit: %s failed: %d (line %d)\n", #call, r_, __LINE__); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

enum { ELEMENTS = 1 << 16, GROUP = 256, MAX_ITER = 100000 };

static VkDevice dev;
static VkQueue queue;
static PFN_vkWaitSemaphores wait_semaphores;
static PFN_vkGetSemaphoreCounterValue semaphore_value;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* the timed parts of one way to submit and wait: each iteration's submit and wait (us), and the whole */
typedef struct {
    double *submit, *wait, *whole;
} Times;

enum Way { KP_FENCE, REUSED_FENCE, POLLED_FENCE, WAIT_IDLE, TIMELINE, POLLED_TIMELINE, WAYS };
static const char *WAY_NAMES[WAYS] = {
    "new fence each time, vkWaitForFences, destroyed (kp 0.9's eval)",
    "one fence, vkWaitForFences, vkResetFences",
    "one fence polled with vkGetFenceStatus, vkResetFences",
    "no fence, vkQueueWaitIdle",
    "timeline semaphore, vkWaitSemaphores",
    "timeline semaphore polled with vkGetSemaphoreCounterValue",
};

static void run_way(enum Way way, VkCommandBuffer cb, VkFence fence, VkSemaphore timeline, uint64_t *counter,
                    int iterations, Times *t)
{
    for (int i = -5; i < iterations; ++i) { /* five untimed first */
        VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
        submit.commandBufferCount = 1;
        submit.pCommandBuffers = &cb;
        VkTimelineSemaphoreSubmitInfo values = {.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
        uint64_t target = *counter + 1;
        if (way == TIMELINE || way == POLLED_TIMELINE) {
            values.signalSemaphoreValueCount = 1;
            values.pSignalSemaphoreValues = &target;
            submit.pNext = &values;
            submit.signalSemaphoreCount = 1;
            submit.pSignalSemaphores = &timeline;
        }
        double t0 = now_us(), t1;
        VkFence used = VK_NULL_HANDLE;
        if (way == KP_FENCE) {
            VkFenceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
            CHECK(vkCreateFence(dev, &info, NULL, &used));
        } else if (way == REUSED_FENCE || way == POLLED_FENCE) {
            used = fence;
        }
        CHECK(vkQueueSubmit(queue, 1, &submit, used));
        t1 = now_us();
        switch (way) {
        case KP_FENCE:
            CHECK(vkWaitForFences(dev, 1, &used, VK_TRUE, UINT64_MAX));
            vkDestroyFence(dev, used, NULL);
            break;
        case REUSED_FENCE:
            CHECK(vkWaitForFences(dev, 1, &used, VK_TRUE, UINT64_MAX));
            CHECK(vkResetFences(dev, 1, &used));
            break;
        case POLLED_FENCE:
            while (vkGetFenceStatus(dev, used) == VK_NOT_READY) {
            }
            CHECK(vkResetFences(dev, 1, &used));
            break;
        case WAIT_IDLE:
            CHECK(vkQueueWaitIdle(queue));
            break;
        case TIMELINE: {
            VkSemaphoreWaitInfo info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
            info.semaphoreCount = 1;
            info.pSemaphores = &timeline;
            info.pValues = &target;
            CHECK(wait_semaphores(dev, &info, UINT64_MAX));
            break;
        }
        case POLLED_TIMELINE: {
            uint64_t value = 0;
            do {
                CHECK(semaphore_value(dev, timeline, &value));
            } while (value < target);
            break;
        }
        default:
            break;
        }
        double t2 = now_us();
        *counter = target;
        if (i >= 0) {
            t->submit[i] = t1 - t0;
            t->wait[i] = t2 - t1;
            t->whole[i] = t2 - t0;
        }
    }
}

/* kp's way with each call timed alone: vkCreateFence, vkQueueSubmit, vkWaitForFences, vkDestroyFence */
static void kp_calls(VkCommandBuffer cb, int iterations, double out[4])
{
    double *v[4];
    for (int k = 0; k < 4; ++k) v[k] = calloc(iterations, sizeof(double));
    for (int i = -5; i < iterations; ++i) {
        VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
        submit.commandBufferCount = 1;
        submit.pCommandBuffers = &cb;
        VkFenceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        VkFence f;
        double t0 = now_us();
        CHECK(vkCreateFence(dev, &info, NULL, &f));
        double t1 = now_us();
        CHECK(vkQueueSubmit(queue, 1, &submit, f));
        double t2 = now_us();
        CHECK(vkWaitForFences(dev, 1, &f, VK_TRUE, UINT64_MAX));
        double t3 = now_us();
        vkDestroyFence(dev, f, NULL);
        double t4 = now_us();
        if (i >= 0) {
            v[0][i] = t1 - t0;
            v[1][i] = t2 - t1;
            v[2][i] = t3 - t2;
            v[3][i] = t4 - t3;
        }
    }
    for (int k = 0; k < 4; ++k) {
        out[k] = median(v[k], iterations);
        free(v[k]);
    }
}

static uint32_t memory_type(VkPhysicalDevice pd, uint32_t bits, VkMemoryPropertyFlags want)
{
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
        if ((bits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) return i;
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
        if (bits & (1u << i)) return i;
    fprintf(stderr, "vk_submit: no memory type\n");
    exit(1);
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 300;
    if (iterations < 1 || iterations > MAX_ITER) iterations = 300;

    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "vk_submit";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    VkInstance instance;
    CHECK(vkCreateInstance(&ici, NULL, &instance));

    uint32_t count = 0;
    CHECK(vkEnumeratePhysicalDevices(instance, &count, NULL));
    if (!count) {
        fprintf(stderr, "vk_submit: no Vulkan device\n");
        return 1;
    }
    VkPhysicalDevice *pds = calloc(count, sizeof *pds);
    CHECK(vkEnumeratePhysicalDevices(instance, &count, pds));
    VkPhysicalDevice pd = pds[0];
    VkPhysicalDeviceProperties props;
    for (uint32_t i = 0; i < count; ++i) {
        vkGetPhysicalDeviceProperties(pds[i], &props);
        if (props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU) {
            pd = pds[i];
            break;
        }
    }
    vkGetPhysicalDeviceProperties(pd, &props);

    uint32_t families = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &families, NULL);
    VkQueueFamilyProperties *qf = calloc(families, sizeof *qf);
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &families, qf);
    uint32_t family = UINT32_MAX;
    for (uint32_t i = 0; i < families && family == UINT32_MAX; ++i)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    if (family == UINT32_MAX) {
        fprintf(stderr, "vk_submit: no compute queue\n");
        return 1;
    }

    VkPhysicalDeviceTimelineSemaphoreFeatures timeline_features = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
    VkPhysicalDeviceFeatures2 features = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    features.pNext = &timeline_features;
    vkGetPhysicalDeviceFeatures2(pd, &features);
    int has_timeline = timeline_features.timelineSemaphore && props.apiVersion >= VK_API_VERSION_1_2;

    float priority = 1.0f;
    VkDeviceQueueCreateInfo dqi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    dqi.queueFamilyIndex = family;
    dqi.queueCount = 1;
    dqi.pQueuePriorities = &priority;
    VkPhysicalDeviceTimelineSemaphoreFeatures enable_timeline = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
    enable_timeline.timelineSemaphore = has_timeline ? VK_TRUE : VK_FALSE;
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.pNext = &enable_timeline;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &dqi;
    CHECK(vkCreateDevice(pd, &dci, NULL, &dev));
    vkGetDeviceQueue(dev, family, 0, &queue);
    if (has_timeline) {
        wait_semaphores = (PFN_vkWaitSemaphores)vkGetDeviceProcAddr(dev, "vkWaitSemaphores");
        semaphore_value = (PFN_vkGetSemaphoreCounterValue)vkGetDeviceProcAddr(dev, "vkGetSemaphoreCounterValue");
        has_timeline = wait_semaphores && semaphore_value;
    }

    /* one storage buffer in device-local memory, a pipeline that adds 1 to each word */
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = ELEMENTS * sizeof(uint32_t);
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    VkBuffer buffer;
    CHECK(vkCreateBuffer(dev, &bci, NULL, &buffer));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, buffer, &req);
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = memory_type(pd, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    VkDeviceMemory memory;
    CHECK(vkAllocateMemory(dev, &mai, NULL, &memory));
    CHECK(vkBindBufferMemory(dev, buffer, memory, 0));

    VkDescriptorSetLayoutBinding binding = {0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    VkDescriptorSetLayoutCreateInfo dsl = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dsl.bindingCount = 1;
    dsl.pBindings = &binding;
    VkDescriptorSetLayout set_layout;
    CHECK(vkCreateDescriptorSetLayout(dev, &dsl, NULL, &set_layout));
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &set_layout;
    VkPipelineLayout pipeline_layout;
    CHECK(vkCreatePipelineLayout(dev, &pli, NULL, &pipeline_layout));
    VkShaderModuleCreateInfo smi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    smi.codeSize = sizeof vk_submit_spv;
    smi.pCode = vk_submit_spv;
    VkShaderModule module;
    CHECK(vkCreateShaderModule(dev, &smi, NULL, &module));
    VkComputePipelineCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    cpi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpi.stage.module = module;
    cpi.stage.pName = "main";
    cpi.layout = pipeline_layout;
    VkPipeline pipeline;
    CHECK(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpi, NULL, &pipeline));

    VkDescriptorPoolSize pool_size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    dpi.maxSets = 1;
    dpi.poolSizeCount = 1;
    dpi.pPoolSizes = &pool_size;
    VkDescriptorPool pool;
    CHECK(vkCreateDescriptorPool(dev, &dpi, NULL, &pool));
    VkDescriptorSetAllocateInfo dsa = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    dsa.descriptorPool = pool;
    dsa.descriptorSetCount = 1;
    dsa.pSetLayouts = &set_layout;
    VkDescriptorSet set;
    CHECK(vkAllocateDescriptorSets(dev, &dsa, &set));
    VkDescriptorBufferInfo dbi = {buffer, 0, VK_WHOLE_SIZE};
    VkWriteDescriptorSet write = {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    write.dstSet = set;
    write.descriptorCount = 1;
    write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    write.pBufferInfo = &dbi;
    vkUpdateDescriptorSets(dev, 1, &write, 0, NULL);

    /* two command buffers recorded once: the dispatch (after a barrier on the previous one's writes), and empty */
    VkCommandPoolCreateInfo cpci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    cpci.queueFamilyIndex = family;
    VkCommandPool command_pool;
    CHECK(vkCreateCommandPool(dev, &cpci, NULL, &command_pool));
    VkCommandBufferAllocateInfo cba = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cba.commandPool = command_pool;
    cba.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cba.commandBufferCount = 2;
    VkCommandBuffer cbs[2];
    CHECK(vkAllocateCommandBuffers(dev, &cba, cbs));
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    CHECK(vkBeginCommandBuffer(cbs[0], &begin));
    VkMemoryBarrier barrier = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    vkCmdPipelineBarrier(cbs[0], VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                         &barrier, 0, NULL, 0, NULL);
    vkCmdBindPipeline(cbs[0], VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vkCmdBindDescriptorSets(cbs[0], VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout, 0, 1, &set, 0, NULL);
    vkCmdDispatch(cbs[0], ELEMENTS / GROUP, 1, 1);
    CHECK(vkEndCommandBuffer(cbs[0]));
    CHECK(vkBeginCommandBuffer(cbs[1], &begin));
    CHECK(vkEndCommandBuffer(cbs[1]));

    VkFence fence;
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    CHECK(vkCreateFence(dev, &fci, NULL, &fence));
    VkSemaphore timeline = VK_NULL_HANDLE;
    if (has_timeline) {
        VkSemaphoreTypeCreateInfo type = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
        type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
        VkSemaphoreCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
        sci.pNext = &type;
        CHECK(vkCreateSemaphore(dev, &sci, NULL, &timeline));
    }
    uint64_t counter = 0;

    printf("## %s: one submission and its wait, us (median of %d; driver version %u.%u)\n\n", props.deviceName,
           iterations, VK_API_VERSION_MAJOR(props.driverVersion), VK_API_VERSION_MINOR(props.driverVersion));
    printf("| way | command buffer | vkQueueSubmit | the wait | whole |\n|---|---|---:|---:|---:|\n");
    Times t = {calloc(iterations, sizeof(double)), calloc(iterations, sizeof(double)), calloc(iterations, sizeof(double))};
    for (int c = 0; c < 2; ++c) {
        for (int w = 0; w < WAYS; ++w) {
            if ((w == TIMELINE || w == POLLED_TIMELINE) && !has_timeline) continue;
            run_way((enum Way)w, cbs[c], fence, timeline, &counter, iterations, &t);
            printf("| %s | %s | %.1f | %.1f | %.1f |\n", WAY_NAMES[w], c ? "empty" : "2^16-word dispatch",
                   median(t.submit, iterations), median(t.wait, iterations), median(t.whole, iterations));
            fflush(stdout);
        }
    }
    double calls[4];
    kp_calls(cbs[0], iterations, calls);
    printf("\nkp's eval call by call (2^16-word dispatch), us: vkCreateFence %.1f, vkQueueSubmit %.1f, vkWaitForFences %.1f, "
           "vkDestroyFence %.1f\n", calls[0], calls[1], calls[2], calls[3]);

    vkDeviceWaitIdle(dev);
    if (timeline) vkDestroySemaphore(dev, timeline, NULL);
    vkDestroyFence(dev, fence, NULL);
    vkDestroyCommandPool(dev, command_pool, NULL);
    vkDestroyDescriptorPool(dev, pool, NULL);
    vkDestroyPipeline(dev, pipeline, NULL);
    vkDestroyShaderModule(dev, module, NULL);
    vkDestroyPipelineLayout(dev, pipeline_layout, NULL);
    vkDestroyDescriptorSetLayout(dev, set_layout, NULL);
    vkDestroyBuffer(dev, buffer, NULL);
    vkFreeMemory(dev, memory, NULL);
    vkDestroyDevice(dev, NULL);
    vkDestroyInstance(instance, NULL);
    free(t.submit);
    free(t.wait);
    free(t.whole);
    free(qf);
    free(pds);
    return 0;
}
