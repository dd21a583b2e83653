/* fake_cuda_driver.c — built as libcuda.so.1 with nothing in it: an NVIDIA driver library that is there but
 * cannot serve the CUDA runtime, as a driver older than the runtime cannot. test_gpu_broken_driver puts it first
 * on LD_LIBRARY_PATH and expects the gpu tests to fail loudly with the reason, not to skip as on a machine
 * without a GPU (core/gpu.h, moe_gpu_device_count). */
int moe_fake_cuda_driver_marker;
