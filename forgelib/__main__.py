from forgelib.cli import main

main()
