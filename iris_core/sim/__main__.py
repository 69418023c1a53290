import sys

from iris_core.sim.launcher import main

sys.exit(main())
