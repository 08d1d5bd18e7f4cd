from specgen.cli.commands import main

main()
