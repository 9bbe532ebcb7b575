from shellyard.cli.entry import main

main()
