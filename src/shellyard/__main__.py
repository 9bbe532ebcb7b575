from shellyard.interfaces.cli import main

main()
