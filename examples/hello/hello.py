"""The hello-world job: prints where it ran and what it was granted."""

import os
import platform
import socket

print(f"hello from {socket.gethostname()} ({platform.system()} {platform.machine()}, "
      f"python {platform.python_version()})")
print(f"job {os.environ.get('GPULAYER_JOB_ID')} task {os.environ.get('GPULAYER_TASK_ID')}")
print(f"accelerator: {os.environ.get('GPULAYER_ACCELERATOR')}, "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
