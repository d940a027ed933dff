from profiler_server.cli import main

main()
