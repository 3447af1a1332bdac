from forgelib.cli.program import main

main()
