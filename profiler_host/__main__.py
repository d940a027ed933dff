from profiler_host.cli import main

main()
