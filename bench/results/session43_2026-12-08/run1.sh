set -x
source .carry/env.sh
T0=$(date +%s); el() { echo "t=$(( $(date +%s) - T0 )) s $*" >> /tmp/o/timeline.txt; }
nvidia-smi > /tmp/o/smi.txt 2>&1; nvidia-smi -q -d CLOCK >> /tmp/o/smi.txt 2>&1
export PYTHONUNBUFFERED=1
( python3 tools/train_dflash.py --out /tmp/d135 --taps 1,3,5 --steps 5707 --max-minutes 6 > /tmp/o/train135.log 2>&1; cp -r /tmp/d135 /tmp/o/ ) &
( python3 tools/train_dflash.py --out /tmp/d345 --taps 3,4,5 --steps 5707 --max-minutes 6 > /tmp/o/train345.log 2>&1; cp -r /tmp/d345 /tmp/o/ ) &
el start-tests
timeout 300 build/bin/kiln_gpu_tests --gtest_filter=-MemoryModelGpu.* > /tmp/o/gpu_tests.log 2>&1; echo "rc=$?" >> /tmp/o/gpu_tests.log
el gpu-tests-done; pack
for t in draft_dflash2 kv_fp8mla quant_exl3 vision nccl; do
  timeout 120 build/bin/kiln_${t}_gpu_tests > /tmp/o/gpu_${t}.log 2>&1; echo "rc=$?" >> /tmp/o/gpu_${t}.log; el $t; pack
done
wait
el training-done; pack
timeout 90 build/bin/kiln_gpu_tests --gtest_filter=MemoryModelGpu.* > /tmp/o/gpu_memory.log 2>&1; echo "rc=$?" >> /tmp/o/gpu_memory.log
el all-done; pack
