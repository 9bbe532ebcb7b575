from shellyard.cli.app import main

main()
