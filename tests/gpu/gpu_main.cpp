// kiln_gpu_tests' entry point: without a CUDA device every test is reported as skipped (exit code 77, the
// SKIP_RETURN_CODE ctest is given), while --gtest_list_tests still works so ctest can discover the tests.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      std::printf("kiln_gpu_tests: no CUDA device (%s); skipping\n",
                  e != cudaSuccess ? cudaGetErrorString(e) : "none found");
      return 77;
    }
  }
  return RUN_ALL_TESTS();
}
